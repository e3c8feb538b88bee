/* This machine's memory read bandwidth, the ceiling a decoder's weight reads are judged against
 * (benchmarks/cpu_kernels.py compiles and runs it). Each of T threads sums its own slice of a
 * 1 GiB buffer with 256-bit loads (AVX2 where compiled, else scalar 64-bit), 5 passes; the best
 * pass's bytes per second over all threads is printed as "GB/s <value>".
 * Usage: read_bandwidth THREADS */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define BYTES (1ull << 30)

typedef struct {
    const uint8_t * p;
    size_t n;
    uint64_t sink;
} slice;

static pthread_barrier_t start;

static void * sum_slice(void * arg) {
    slice * s = (slice *) arg;
    pthread_barrier_wait(&start);
#if defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= s->n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *) (s->p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *) (s->p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *) (s->p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *) (s->p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *) out, a0);
    s->sink = out[0] + out[1] + out[2] + out[3];
#else
    uint64_t acc = 0;
    for (size_t i = 0; i + 8 <= s->n; i += 8) {
        uint64_t v;
        memcpy(&v, s->p + i, 8);
        acc += v;
    }
    s->sink = acc;
#endif
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

int main(int argc, char ** argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "threads %d: give 1..256\n", threads);
        return 2;
    }
    uint8_t * buf = aligned_alloc(64, BYTES);
    if (!buf) return 1;
    memset(buf, 1, BYTES); /* touch every page: the passes measure reads, not page faults */
    double best = 0;
    uint64_t sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        pthread_t th[256];
        slice sl[256];
        pthread_barrier_init(&start, NULL, (unsigned) threads + 1);
        const size_t per = (BYTES / (size_t) threads) & ~(size_t) 127;
        for (int t = 0; t < threads; t++) {
            sl[t] = (slice) { buf + (size_t) t * per, per, 0 };
            pthread_create(&th[t], NULL, sum_slice, &sl[t]);
        }
        pthread_barrier_wait(&start);
        const double t0 = now();
        for (int t = 0; t < threads; t++) {
            pthread_join(th[t], NULL);
            sink += sl[t].sink;
        }
        const double gbs = (double) per * threads / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
        pthread_barrier_destroy(&start);
    }
    printf("GB/s %.2f\n", best);
    return sink == 42 ? 3 : 0; /* keeps the sums alive */
}
