/* What one core of this CPU can multiply-add for a 1-bit matmul, the ceiling a batched Q1_0
 * verify is judged against (issue 49; docs/benchmarks.md, "A CPU without AMX").
 *
 * - vpdpbusd on zmm: 64 int8 multiply-adds each, from 12 independent chains. Patch 0011's
 *   kernels spend one per column and 4 weights of 16 rows; past a column or two a batch is bound
 *   by them, so pp_n can never beat this rate over the model's multiply-adds per token.
 * - vpermw + vpaddw on zmm: the inner step of a lookup-table kernel for +-1 weights (32 int16
 *   lookups of the signed sum of g int8 activations, indexed by g weight bits, then added), from
 *   8 independent chains, in weight multiply-adds at g = 4 and g = 5. This is what such a kernel
 *   could reach with its tables in registers; a real one loads them from cache.
 * - vpmaddubsw + vpaddw on ymm: what the AVX2 kernels (no VNNI: bonsai's portable build, an
 *   AVX2-only CPU) spend per column and 4 weights of 8 rows, 32 multiply-adds a pair, from 4
 *   independent chains of 2 distinct pairs each (the same operands would be computed once; more
 *   chains than registers and the compiler keeps sums in memory).
 * - a chain of dependent adds: about the core's clock (one add a cycle).
 *
 * Build and run (AVX2 needed, AVX-512 BW and VNNI for the zmm lines; one thread, nothing else running):
 *     cc -O2 -march=native benchmarks/int8_peak.c -o /tmp/int8_peak && /tmp/int8_peak
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#if !defined(__AVX2__)
#error "int8_peak needs AVX2 (-march=native on such a CPU)"
#endif
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define ZMM 1
#else
#define ZMM 0
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define KEEP(...) __asm__ volatile("" : __VA_ARGS__)

int main(void) {
    const long n = 100000000;
    double t;

#if ZMM
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    __m512i c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
    t = now();
    for (long i = 0; i < n; i++) {
        c0 = _mm512_dpbusd_epi32(c0, a, b), c1 = _mm512_dpbusd_epi32(c1, a, b);
        c2 = _mm512_dpbusd_epi32(c2, a, b), c3 = _mm512_dpbusd_epi32(c3, a, b);
        c4 = _mm512_dpbusd_epi32(c4, a, b), c5 = _mm512_dpbusd_epi32(c5, a, b);
        c6 = _mm512_dpbusd_epi32(c6, a, b), c7 = _mm512_dpbusd_epi32(c7, a, b);
        c8 = _mm512_dpbusd_epi32(c8, a, b), c9 = _mm512_dpbusd_epi32(c9, a, b);
        c10 = _mm512_dpbusd_epi32(c10, a, b), c11 = _mm512_dpbusd_epi32(c11, a, b);
        KEEP("+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7), "+v"(c8), "+v"(c9),
             "+v"(c10), "+v"(c11));
    }
    t = now() - t;
    const double dpbusd = n * 12 / t;
    printf("vpdpbusd zmm:  %.2f G/s = %.0f G int8 multiply-adds/s\n", dpbusd / 1e9, dpbusd * 64 / 1e9);

    __m512i tab = _mm512_set1_epi16(3), i0 = _mm512_set1_epi16(1), i1 = _mm512_set1_epi16(2);
    __m512i i2 = _mm512_set1_epi16(5), i3 = _mm512_set1_epi16(7);
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    t = now();
    for (long i = 0; i < n; i++) {
        s0 = _mm512_add_epi16(s0, _mm512_permutexvar_epi16(i0, tab));
        s1 = _mm512_add_epi16(s1, _mm512_permutexvar_epi16(i1, tab));
        s2 = _mm512_add_epi16(s2, _mm512_permutexvar_epi16(i2, tab));
        s3 = _mm512_add_epi16(s3, _mm512_permutexvar_epi16(i3, tab));
        s4 = _mm512_add_epi16(s4, _mm512_permutexvar_epi16(i0, tab));
        s5 = _mm512_add_epi16(s5, _mm512_permutexvar_epi16(i1, tab));
        s6 = _mm512_add_epi16(s6, _mm512_permutexvar_epi16(i2, tab));
        s7 = _mm512_add_epi16(s7, _mm512_permutexvar_epi16(i3, tab));
        KEEP("+v"(s0), "+v"(s1), "+v"(s2), "+v"(s3), "+v"(s4), "+v"(s5), "+v"(s6), "+v"(s7), "+v"(tab), "+v"(i0),
             "+v"(i1), "+v"(i2), "+v"(i3));
    }
    t = now() - t;
    const double pairs = n * 8 / t;
    printf("vpermw+vpaddw: %.2f G pairs/s = %.0f G weight multiply-adds/s at g = 4, %.0f at g = 5 (%.2fx and %.2fx vpdpbusd)\n",
           pairs / 1e9, pairs * 32 * 4 / 1e9, pairs * 32 * 5 / 1e9, pairs * 32 * 4 / (dpbusd * 64),
           pairs * 32 * 5 / (dpbusd * 64));
#endif

    __m256i w = _mm256_set1_epi8(1), y0 = _mm256_set1_epi8(2), y1 = _mm256_set1_epi8(3), y2 = _mm256_set1_epi8(4);
    __m256i y3 = _mm256_set1_epi8(5);
    __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
    t = now();
    for (long i = 0; i < n; i++) {
        h0 = _mm256_add_epi16(h0, _mm256_maddubs_epi16(w, y0)), h1 = _mm256_add_epi16(h1, _mm256_maddubs_epi16(w, y1));
        h2 = _mm256_add_epi16(h2, _mm256_maddubs_epi16(w, y2)), h3 = _mm256_add_epi16(h3, _mm256_maddubs_epi16(w, y3));
        h0 = _mm256_add_epi16(h0, _mm256_maddubs_epi16(y0, w)), h1 = _mm256_add_epi16(h1, _mm256_maddubs_epi16(y1, w));
        h2 = _mm256_add_epi16(h2, _mm256_maddubs_epi16(y2, w)), h3 = _mm256_add_epi16(h3, _mm256_maddubs_epi16(y3, w));
        KEEP("+x"(h0), "+x"(h1), "+x"(h2), "+x"(h3), "+x"(w), "+x"(y0), "+x"(y1), "+x"(y2), "+x"(y3));
    }
    t = now() - t;
    const double maddubs = n * 8 / t;
    printf("vpmaddubsw+vpaddw ymm: %.2f G pairs/s = %.0f G int8 multiply-adds/s\n", maddubs / 1e9, maddubs * 32 / 1e9);

    long x = 0;
    const long m = 1000000000;
    t = now();
    for (long i = 0; i < m; i++) {
        __asm__ volatile("add $1, %0" : "+r"(x));
    }
    t = now() - t;
    printf("dependent adds: %.2f G/s (about the clock, GHz)\n", m / t / 1e9);

    /* keep the results live */
    const __m256i sum16 = _mm256_add_epi16(_mm256_add_epi16(h0, h1), _mm256_add_epi16(h2, h3));
#if ZMM
    const __m512i all = _mm512_add_epi32(_mm512_add_epi32(c0, c11), _mm512_add_epi16(s0, s7));
    return _mm512_reduce_add_epi32(all) == 12345 && _mm256_extract_epi16(sum16, 0) == 1 && x == 0;
#else
    return _mm256_extract_epi16(sum16, 0) == 1 && x == 0;
#endif
}
