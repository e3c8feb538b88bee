/* The CPU dot products for Bonsai's formats (Q1_0, Q2_0) checked against a reference written here
 * from the block layouts, through the built ggml libraries' public API and their mul_mat.
 *
 * Built and run by bonsai's self-test (llamacpp/builds/kernel_check.py: after `bonsai build`, and
 * `bonsai doctor --self-test`) and by tests/test_cpu_kernels.py against the static libraries of a
 * build. Exit 0 and a last line "ok" when every check passes; otherwise one line per failure and
 * exit 1. Before the last line, one line per type: "type Q1_0 ok" or "type Q1_0 failed N" (what
 * the self-test refuses the build for). Checks:
 *  - which kernel is wired in (x86 with AVX2: Q2_0's vec_dot is not the scalar reference, patch
 *    0005; Q1_0 and Q2_0 do 2 rows x 2 columns a call, patch 0006);
 *  - vec_dot (nrc 1 and, where offered, 2) on random blocks, all-(-1) / all-(+2) codes, extreme
 *    scales and +-127 activations, at several row lengths, against the exact integer reference;
 *  - ggml_mul_mat at every batch size 1..9 and 16, 17, 33 (odd tails, the 2x2 pairing and the
 *    16-column tiles), odd and even row counts, 1 and 2 threads, against the same reference;
 *    and each batched column bit-identical to that column computed alone (greedy speculative
 *    verification relies on it);
 *  - Q4_0, Q8_0 and F16 (the other types Bonsai files keep matrices in): ggml_mul_mat at batch
 *    sizes 1..9, 16, 17, plain and, where the CPU backend offers it, repacked, against a double
 *    reference from ggml's own dequantization of the weights and of the activations as the
 *    kernel sees them (vec_dot_type), and each batched column against that column alone;
 *  - the same for weights in the CPU backend's repack buffer (what llama-server uses unless
 *    --no-repack), where patch 0011 repacks Q1_0 and Q2_0 sixteen rows at a time on x86 and
 *    runs every batch (1-17, 33: eight or four columns at a time through one tile) in one pass
 *    over the weights. On x86 with AVX2 it fails when either type is not repacked at 16 rows,
 *    or at 4 (the four-row layout of the old patches 0008-0009). On a build with AMX-INT8, patch
 *    0014 sends the batches of 8 or more columns through the AMX tiles: the same checks cover
 *    them, and it fails when no batch took the tiles or the build lacks the patch. Patch 0018
 *    quantizes the activations of repacked Q1_0 to int8 with one scale per 128 (the reference
 *    does the same from its definition; Q1_0 takes the tiles from 4 columns); on x86 with AVX2
 *    it fails without that patch;
 *  - patch 0020: Q4_0 weights of 16 rows in the same tiles, and Q8_0 where the build has dpbusd
 *    (patch 0026: on AVX2 without it too, each weight's sign applied to the activations)
 *    (their layout read back from the repack buffer; on x86 with AVX2 it fails when they are
 *    not), every batch 1-17 and 33 against
 *    ggml's dequantization, every code 15 against +-1 activations (the maddubs path's largest
 *    int16 sums), each column bit-identical alone and batched; and GGML_OP_MUL_MAT_ID on 3-D
 *    weights in the repack buffer (a mixture of experts), which rows16 must leave to layouts
 *    that compute it;
 *  - patch 0021: weights of 65 tiles, which the repack splits among threads (where the machine
 *    has two or more cores), against the same references;
 *  - patch 0022: Q4_K in the tiles (their opening d and dmin read back; on x86 with AVX2 it fails
 *    without the patch), the same batches against ggml's dequantization with the Q8_0
 *    activations the tiles take, each column bit-identical alone and batched; reported as a
 *    type of its own ("type q4_K ok");
 *  - patch 0023: Q5_0 in the tiles (its scales, fifth bits and nibbles read back; on x86 with AVX2
 *    it fails without the patch), the same batches against ggml's dequantization, every code 31
 *    against +-1 activations (the maddubs path's largest int16 sums over its runs of 4 steps),
 *    each column bit-identical alone and batched; a type of its own ("type q5_0 ok");
 *  - patch 0024: Q6_K in the tiles (the 16 rows' d and scales read back; on x86 with AVX2 it fails
 *    without the patch), the same batches against ggml's dequantization with Q8_0 activations,
 *    every code 63 with scale 127 and every code 0 with scale -128 against +-1 activations (the
 *    maddubs path's largest int16 sums, the int32 scaling's largest products), each column
 *    bit-identical alone and batched; a type of its own ("type q6_K ok");
 *  - patch 0025: Q5_K in the tiles (d and dmin read back, as for Q4_K; on x86 with AVX2 it fails
 *    without the patch), the same batches against ggml's dequantization with Q8_0 activations,
 *    every code 31 with the largest scales and mins against +-1 activations, each column
 *    bit-identical alone and batched; a type of its own ("type q5_K ok").
 * Arguments: `x86` expects the x86 kernels even where the probe says no; `results-only` checks
 * the answers but not which kernels are wired in (a build of another source, such as PrismML's
 * fork, has its own kernels and none of our patches); `quick` (the self-test
 * after `bonsai build`) keeps every path (each batch size class, odd tails, 1 and 2 threads,
 * plain and repacked) but fewer sizes and repetitions: about a tenth of the full run.
 * Tolerance: |kernel - reference| <= 3e-5 x sum of |terms| (float32 summation order only); where
 * the data has unit scale, also llama.cpp's test-quantize-fns bound (error / n <= 0.02).
 */
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Layouts (ggml-common.h): fp16 scale then the codes. */
typedef struct { uint16_t d; uint8_t qs[16]; } q1_block; /* 128 weights, bit set = +d, clear = -d */
typedef struct { uint16_t d; uint8_t qs[16]; } q2_block; /* 64 weights, code {0,1,2,3} = {-1,0,1,2} x d */
typedef struct { uint16_t d; int8_t qs[32]; } q8_block;  /* 32 activations */
/* PrismML's PTQ1_0 (patch 0012, the fork's type id 143): 128 ternary codes in 26 bytes of five
 * base-3 digits each (first most significant, stored as ceil(v * 256 / 243)), then d. qs[m]
 * (m < 16) holds weights m + 16n, qs[16 + m] (m < 8) 80 + m + 8n, qh[h] 120 + h + 2n (four
 * digits and a zero one); value (code - 1) x d. */
typedef struct { uint8_t qs[24]; uint8_t qh[2]; uint16_t d; } ptq1_block;
#define PTQ1_0 ((enum ggml_type) 143)
/* builds without patch 0012 (the pin alone, another source) have no type 143 */
static int has_ptq1_0(void) { return GGML_TYPE_COUNT > 143 && ggml_type_size(PTQ1_0) == sizeof(ptq1_block); }
static int per_block(enum ggml_type t) { return t == GGML_TYPE_Q2_0 ? 64 : 128; }
static size_t block_bytes(enum ggml_type t) { return t == PTQ1_0 ? sizeof(ptq1_block) : 18; }

/* the weight index a PTQ1_0 byte's digit n holds (-1: qh's unused fifth digit) */
static int ptq1_element(int m, int n) {
    if (m < 16) return m + 16 * n;
    if (m < 24) return 80 + (m - 16) + 8 * n;
    return n < 4 ? 120 + (m - 24) + 2 * n : -1;
}
static int ptq1_code(const ptq1_block * b, int j) {
    for (int m = 0; m < 26; m++) {
        unsigned x = m < 24 ? b->qs[m] : b->qh[m - 24];
        for (int n = 0; n < 5; n++) {
            if (ptq1_element(m, n) == j) return (int) ((x * 3) >> 8);
            x = (x * 3) & 0xFF;
        }
    }
    return -1;
}
static void ptq1_encode(ptq1_block * b, const uint8_t * codes) {
    for (int m = 0; m < 26; m++) {
        int v = 0;
        for (int n = 0; n < 5; n++) {
            const int e = ptq1_element(m, n);
            v = v * 3 + (e >= 0 ? codes[e] : 0);
        }
        const uint8_t byte = (uint8_t) ((v * 256 + 242) / 243);
        if (m < 24) b->qs[m] = byte; else b->qh[m - 24] = byte;
    }
}

/* The scalar reference shipped in ggml-cpu/quants.c; on x86 builds with patch 0005 it is a
 * function of its own next to the SIMD one, without the patch its name does not exist. */
extern void ggml_vec_dot_q2_0_q8_0_generic(int, float *, size_t, const void *, size_t, const void *, size_t, int)
    __attribute__((weak));

/* Patch 0014: how many batched rows16 matmul calls took the AMX tiles, -1 where they cannot run
 * (no AMX-INT8, the kernel refuses the tile state, GGML_ROWS16_AMX=0); absent without the patch. */
extern int ggml_rows16_amx_calls(void) __attribute__((weak));

/* Patch 0018: on x86 the repacked Q1_0 kernels take each activation column as int8 quants with one
 * scale per 128 (a Q1_0 block) instead of Q8_0's one per 32; absent without the patch. */
extern void ggml_rows16_quantize_acts128(const float *, int8_t *, void *, int64_t) __attribute__((weak));

/* Patch 0020: Q4_0 weights of 16 rows repacked into the same tiles (layout checked below); absent
 * without the patch. */
extern void ggml_rows16_repack_q4_0(void *, const void *, int64_t, int64_t) __attribute__((weak));

static int failures = 0;
static int quick = 0;
static enum ggml_type cur_type = GGML_TYPE_Q1_0; /* whose check is running: failures count against it */
static int type_failures[256]; /* by type id: 143 (PTQ1_0) may be past this build's GGML_TYPE_COUNT */
#define FAIL(...) do { printf("FAIL: " __VA_ARGS__); printf("\n"); failures++; type_failures[cur_type]++; } while (0)

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t) (rng_state >> 16);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float) (rnd() % 1000001) / 1000000.0f; }

static float weight(enum ggml_type t, const void * row, int j) {
    if (t == PTQ1_0) {
        return (float) (ptq1_code((const ptq1_block *) row + j / 128, j % 128) - 1);
    }
    if (t == GGML_TYPE_Q1_0) {
        const q1_block * b = (const q1_block *) row + j / 128;
        return ((b->qs[(j % 128) / 8] >> (j % 8)) & 1) ? 1.0f : -1.0f;
    }
    const q2_block * b = (const q2_block *) row + j / 64;
    return (float) (((b->qs[(j % 64) / 4] >> (2 * (j % 4))) & 3) - 1);
}
static float wscale(enum ggml_type t, const void * row, int j) {
    if (t == PTQ1_0) return ggml_fp16_to_fp32(((const ptq1_block *) row)[j / 128].d);
    const uint16_t d = t == GGML_TYPE_Q1_0 ? ((const q1_block *) row)[j / 128].d : ((const q2_block *) row)[j / 64].d;
    return ggml_fp16_to_fp32(d);
}

/* exact integer sum per Q8_0 block, scaled in double; *mag = sum of |terms| */
static double ref_dot(enum ggml_type t, const void * row, const q8_block * y, int n, double * mag) {
    double sum = 0.0, m = 0.0;
    for (int b = 0; b < n / 32; b++) {
        long isum = 0, iabs = 0;
        for (int k = 0; k < 32; k++) {
            const long p = (long) weight(t, row, 32 * b + k) * y[b].qs[k];
            isum += p;
            iabs += labs(p);
        }
        const double sc = (double) wscale(t, row, 32 * b) * ggml_fp16_to_fp32(y[b].d);
        sum += sc * isum;
        m += fabs(sc) * iabs;
    }
    *mag = m;
    return sum;
}

/* Patch 0018's activations, written from its definition: per 128 values d = absmax / 127 and
 * q = x / d rounded to nearest even (x * (1 / d), in float, as the kernels do). */
static void quantize_acts128(const float * x, int n, int8_t * q, float * d) {
    for (int g = 0; g < n / 128; g++) {
        float amax = 0.0f;
        for (int i = 0; i < 128; i++) amax = fmaxf(amax, fabsf(x[128 * g + i]));
        d[g] = amax / 127.0f;
        const float id = d[g] != 0.0f ? 1.0f / d[g] : 0.0f;
        for (int i = 0; i < 128; i++) q[128 * g + i] = (int8_t) fmaxf(-128.0f, fminf(127.0f, nearbyintf(x[128 * g + i] * id)));
    }
}

/* exact integer sum per 128 against those activations, scaled in double */
static double ref_dot128(enum ggml_type t, const void * row, const int8_t * q, const float * d, int n, double * mag) {
    double sum = 0.0, m = 0.0;
    for (int g = 0; g < n / 128; g++) {
        long isum = 0, iabs = 0;
        for (int k = 0; k < 128; k++) {
            const long p = (long) weight(t, row, 128 * g + k) * q[128 * g + k];
            isum += p;
            iabs += labs(p);
        }
        const double sc = (double) wscale(t, row, 128 * g) * d[g];
        sum += sc * isum;
        m += fabs(sc) * iabs;
    }
    *mag = m;
    return sum;
}

/* test-quantize-fns' bound (error / n <= 0.02) is meant for data of unit scale; extreme scales
 * (fp16's largest d, +-127 activations at d = 60000) are held to the relative bound alone */
static int close_enough(double got, double want, double mag, int n) {
    if (!isfinite(got)) return 0;
    const double err = fabs(got - want);
    const int unit_scale = mag / n < 1e3;
    return err <= 3e-5 * mag + 1e-30 && (!unit_scale || err / n <= 0.02);
}

enum fill { RANDOM, ALL_LOW, ALL_HIGH, EXTREME };

static void fill_weights(enum ggml_type t, void * rows, int nrows, int n, enum fill f) {
    const int per = per_block(t);
    const int nb = nrows * n / per;
    if (t == PTQ1_0) { /* codes 0..2: all -1, all +1, or random */
        for (int i = 0; i < nb; i++) {
            ptq1_block * b = (ptq1_block *) rows + i;
            uint8_t codes[128];
            for (int k = 0; k < 128; k++) codes[k] = f == ALL_LOW ? 0 : f == ALL_HIGH ? 2 : (uint8_t) (rnd() % 3);
            ptq1_encode(b, codes);
            float d = frand(-0.05f, 0.05f);
            if (f == EXTREME) d = (i % 3 == 0) ? 65504.0f : (i % 3 == 1) ? -6.0e-8f : 1.0e-3f;
            b->d = ggml_fp32_to_fp16(d);
        }
        return;
    }
    for (int i = 0; i < nb; i++) {
        q2_block * b = (q2_block *) rows + i; /* same size and field offsets as q1_block */
        float d = frand(-0.05f, 0.05f);
        if (f == EXTREME) d = (i % 3 == 0) ? 65504.0f : (i % 3 == 1) ? -6.0e-8f : 1.0e-3f;
        b->d = ggml_fp32_to_fp16(d);
        for (int k = 0; k < 16; k++) {
            b->qs[k] = f == ALL_LOW ? 0x00 : f == ALL_HIGH ? 0xFF : (uint8_t) rnd();
        }
    }
}

static void fill_acts(q8_block * y, int nblocks, enum fill f) {
    for (int i = 0; i < nblocks; i++) {
        y[i].d = ggml_fp32_to_fp16(f == EXTREME ? ((i % 2) ? 60000.0f : 1.0e-4f) : frand(0.001f, 0.02f));
        for (int k = 0; k < 32; k++) {
            y[i].qs[k] = f == EXTREME ? ((rnd() & 1) ? 127 : -127) : (int8_t) ((int) (rnd() % 255) - 127);
        }
    }
}

static const char * tname(enum ggml_type t) { return t == GGML_TYPE_Q1_0 ? "Q1_0" : t == GGML_TYPE_Q2_0 ? "Q2_0" : "PTQ1_0"; }

static void check_vec_dot(enum ggml_type t) {
    const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(t);
    const int per = per_block(t);
    const size_t bsize = block_bytes(t);
    const int lens[] = { per, 2 * per, 3 * per, 5 * per, 2048, 6144 };
    const enum fill fills[] = { RANDOM, ALL_LOW, ALL_HIGH, EXTREME };
    for (unsigned li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        const int n = lens[li];
        const size_t bx = (size_t) (n / per) * bsize + 64; /* padded strides, as test-quantize-fns does */
        const size_t by = (size_t) (n / 32) * sizeof(q8_block) + 64;
        for (unsigned fi = 0; fi < 4; fi++) {
            for (int rep = 0; rep < (quick ? 2 : 8); rep++) {
                if (quick && n > 2048) break;
                char * x = calloc(2, bx);
                char * y = calloc(2, by);
                fill_weights(t, x, 1, n, fills[fi]);
                fill_weights(t, x + bx, 1, n, fills[(fi + rep) % 4]);
                fill_acts((q8_block *) y, n / 32, fills[fi] == EXTREME ? EXTREME : RANDOM);
                fill_acts((q8_block *) (y + by), n / 32, rep % 2 ? EXTREME : RANDOM);
                double want[2][2], mag[2][2];
                for (int r = 0; r < 2; r++)
                    for (int c = 0; c < 2; c++)
                        want[r][c] = ref_dot(t, x + r * bx, (const q8_block *) (y + c * by), n, &mag[r][c]);
                float one[2][2];
                for (int r = 0; r < 2; r++) {
                    for (int c = 0; c < 2; c++) {
                        one[r][c] = NAN;
                        tr->vec_dot(n, &one[r][c], 0, x + r * bx, 0, y + c * by, 0, 1);
                        if (!close_enough(one[r][c], want[r][c], mag[r][c], n)) {
                            FAIL("%s vec_dot nrc=1 n=%d fill=%u: %.9g, reference %.9g", tname(t), n, fi, one[r][c], want[r][c]);
                        }
                    }
                }
                if (t == GGML_TYPE_Q2_0 && ggml_vec_dot_q2_0_q8_0_generic) {
                    float g = NAN;
                    ggml_vec_dot_q2_0_q8_0_generic(n, &g, 0, x, 0, y, 0, 1);
                    if (!close_enough(g, want[0][0], mag[0][0], n)) {
                        FAIL("Q2_0 generic n=%d fill=%u: %.9g, reference %.9g (the reference here is wrong?)", n, fi, g, want[0][0]);
                    }
                }
                if (tr->nrows == 2) {
                    float s[18];
                    for (int i = 0; i < 18; i++) s[i] = NAN;
                    tr->vec_dot(n, s, 16, x, bx, y, by, 2);
                    for (int r = 0; r < 2; r++) {
                        for (int c = 0; c < 2; c++) {
                            if (memcmp(&s[c * 16 + r], &one[r][c], sizeof(float)) != 0) {
                                FAIL("%s vec_dot nrc=2 n=%d fill=%u row %d col %d: %.9g, nrc=1 gives %.9g", tname(t), n, fi, r, c,
                                     s[c * 16 + r], one[r][c]);
                            }
                        }
                    }
                }
                free(x);
                free(y);
            }
        }
    }
}

/* The CPU backend's repack buffer type (weights rearranged for its gemv/gemm kernels), or NULL */
static ggml_backend_buffer_type_t repack_buffer_type(void) {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    typedef ggml_backend_buffer_type_t * (*extra_bufts_fn)(ggml_backend_dev_t);
    extra_bufts_fn extra = (extra_bufts_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = extra ? extra(dev) : NULL; b && *b; b++) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
    }
    return NULL;
}

/* A weight [n x rows] in the repack buffer, or NULL (and nothing left allocated) when that buffer
 * does not rearrange this type and shape (its init leaves extra unset) */
static struct ggml_tensor * new_repacked_weight(enum ggml_type t, int n, int rows, struct ggml_context ** wctx,
                                                ggml_backend_buffer_t * wbuf) {
    ggml_backend_buffer_type_t buft = repack_buffer_type();
    struct ggml_init_params wp = { ggml_tensor_overhead() * 2, NULL, true };
    *wctx = ggml_init(wp);
    struct ggml_tensor * w = ggml_new_tensor_2d(*wctx, t, n, rows);
    *wbuf = buft ? ggml_backend_alloc_ctx_tensors_from_buft(*wctx, buft) : NULL;
    if (*wbuf && w->extra) return w;
    if (*wbuf) ggml_backend_buffer_free(*wbuf);
    ggml_free(*wctx);
    *wctx = NULL;
    *wbuf = NULL;
    return NULL;
}

static int repacks(enum ggml_type t, int n, int rows) {
    struct ggml_context * wctx;
    ggml_backend_buffer_t wbuf;
    if (!new_repacked_weight(t, n, rows, &wctx, &wbuf)) return 0;
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    return 1;
}

/* ggml_mul_mat(W [n x rows], A [n x batch] f32) through the CPU backend's graph compute; with
 * `repacked`, W lives in the repack buffer as llama-server's weights do */
static void check_mul_mat(enum ggml_type t, int n, int rows, int batch, int threads, int repacked) {
    struct ggml_init_params ip = { 64 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    const size_t wrow = ggml_row_size(t, n);
    char * wdata = malloc(wrow * (size_t) rows);
    fill_weights(t, wdata, rows, n,
                 (batch + rows) % 5 == 0 ? ALL_HIGH : (batch + rows) % 7 == 0 ? ALL_LOW : (batch + rows) % 3 == 0 ? EXTREME : RANDOM);
    struct ggml_context * wctx = NULL;
    ggml_backend_buffer_t wbuf = NULL;
    struct ggml_tensor * w;
    const char * path = repacked ? "repacked" : "plain";
    if (repacked) {
        w = new_repacked_weight(t, n, rows, &wctx, &wbuf);
        if (!w) {
            FAIL("%s n=%d rows=%d is not repacked", tname(t), n, rows);
            ggml_free(ctx);
            free(wdata);
            return;
        }
        ggml_backend_tensor_set(w, wdata, 0, ggml_nbytes(w));
    } else {
        w = ggml_new_tensor_2d(ctx, t, n, rows);
        memcpy(w->data, wdata, ggml_nbytes(w));
    }
    struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, batch);
    float * af = (float *) a->data;
    for (int i = 0; i < n * batch; i++) af[i] = frand(-1.0f, 1.0f);
    if (batch % 4 == 1) memset(af + (size_t) (batch - 1) * n, 0, sizeof(float) * (size_t) (n < 128 ? n : 128)); /* zeros: scale 0 */
    struct ggml_tensor * out = ggml_mul_mat(ctx, w, a);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) {
        FAIL("%s %s mul_mat n=%d rows=%d batch=%d: compute failed", tname(t), path, n, rows, batch);
        if (wbuf) ggml_backend_buffer_free(wbuf);
        if (wctx) ggml_free(wctx);
        ggml_free(ctx);
        free(wdata);
        return;
    }
    /* the activations as mul_mat quantizes them: the CPU backend's own Q8_0 from_float, or, for
     * Q1_0 repacked by a build with patch 0018, int8 with one scale per 128 */
    const int acts128 = repacked && t == GGML_TYPE_Q1_0 && ggml_rows16_quantize_acts128;
    const struct ggml_type_traits_cpu * q8 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0);
    q8_block * yq = malloc(sizeof(q8_block) * (size_t) (n / 32));
    int8_t * q128 = malloc((size_t) n);
    float * d128 = malloc(sizeof(float) * (size_t) (n / 128 + 1));
    const float * of = (const float *) out->data;
    for (int c = 0; c < batch; c++) {
        if (acts128) quantize_acts128(af + (size_t) c * n, n, q128, d128);
        else q8->from_float(af + (size_t) c * n, yq, n);
        for (int r = 0; r < rows; r++) {
            double mag;
            const double want = acts128 ? ref_dot128(t, wdata + r * wrow, q128, d128, n, &mag) : ref_dot(t, wdata + r * wrow, yq, n, &mag);
            const float got = of[(size_t) c * rows + r];
            if (!close_enough(got, want, mag, n)) {
                FAIL("%s %s mul_mat n=%d rows=%d batch=%d threads=%d: [%d,%d] %.9g, reference %.9g", tname(t), path, n, rows,
                     batch, threads, r, c, got, want);
                c = batch;
                break;
            }
        }
    }
    /* each column alone (a batch of 1, the decode path) gives the same bits */
    if (batch > 1) {
        struct ggml_tensor * a1 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, 1);
        struct ggml_tensor * o1 = ggml_mul_mat(ctx, w, a1);
        struct ggml_cgraph * g1 = ggml_new_graph(ctx);
        ggml_build_forward_expand(g1, o1);
        for (int c = 0; c < batch; c++) {
            memcpy(a1->data, af + (size_t) c * n, sizeof(float) * (size_t) n);
            ggml_graph_compute_with_ctx(ctx, g1, threads);
            if (memcmp(o1->data, of + (size_t) c * rows, sizeof(float) * (size_t) rows) != 0) {
                FAIL("%s %s mul_mat n=%d rows=%d batch=%d threads=%d: column %d differs from the same column alone", tname(t),
                     path, n, rows, batch, threads, c);
                break;
            }
        }
    }
    free(yq);
    free(q128);
    free(d128);
    if (wbuf) ggml_backend_buffer_free(wbuf);
    if (wctx) ggml_free(wctx);
    ggml_free(ctx);
    free(wdata);
}

/* Q4_0, Q8_0, F16: ggml's own dequantization is the reference (their layouts are upstream's and
 * test-quantize-fns covers their round trip); what is checked is the kernels and mul_mat paths of
 * this build, plain and repacked, against it, and each batched column against the column alone.
 * Tolerance 1e-4 x sum of |terms|: F16 products are summed in float, not as exact integers. */
/* A weight row through ggml's own dequantization against activations already dequantized (ad),
 * summed in double; *mag = sum of |terms|. wd: n floats of scratch. Within 1e-4 x mag is a match:
 * F16 products are summed in float, not as exact integers. */
static double dequant_dot(const struct ggml_type_traits * tt, const void * row, const float * ad, float * wd, int n,
                          double * mag) {
    tt->to_float(row, wd, n);
    double want = 0.0, m = 0.0;
    for (int k = 0; k < n; k++) {
        want += (double) wd[k] * ad[k];
        m += fabs((double) wd[k] * ad[k]);
    }
    *mag = m;
    return want;
}
static int near_dequant(float got, double want, double mag) { return isfinite(got) && fabs(got - want) <= 1e-4 * mag + 1e-30; }

/* With `exact` (Q4_0 and Q8_0 in patch 0020's tiles) each column alone must give the same bits as
 * in the batch; `f` other than RANDOM writes Q4_0/Q5_0/Q8_0 blocks directly against +-1
 * activations: every code at its top (ALL_HIGH: Q4_0 15 and Q5_0 31, the largest sums the maddubs
 * path keeps in int16; Q8_0 127) or its bottom (ALL_LOW: Q4_0 and Q5_0 0, Q8_0 -128, whose |w| times
 * 127 gives patch 0026's largest maddubs pairs). */
static void check_generic_mul_mat_fill(enum ggml_type t, int n, int rows, int batch, int threads, int repacked, int exact,
                                       enum fill f) {
    const struct ggml_type_traits * tt = ggml_get_type_traits(t);
    /* the K-quants' tiles (patches 0022, 0024, 0025) take Q8_0 activations (upstream's kernels Q8_K) */
    const int kquant = t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K || t == GGML_TYPE_Q6_K;
    const enum ggml_type vt = exact && kquant ? GGML_TYPE_Q8_0 : ggml_get_type_traits_cpu(t)->vec_dot_type;
    const struct ggml_type_traits_cpu * vtc = ggml_get_type_traits_cpu(vt);
    const struct ggml_type_traits * vtt = ggml_get_type_traits(vt);
    const char * path = repacked ? "repacked" : "plain";
    const size_t wrow = ggml_row_size(t, n);
    float * wf = malloc(sizeof(float) * (size_t) n * rows);
    for (int i = 0; i < n * rows; i++) wf[i] = frand(-1.0f, 1.0f) * ((i / n) % 3 == 0 ? 30.0f : 0.05f);
    char * wdata = malloc(wrow * (size_t) rows);
    ggml_quantize_chunk(t, wf, wdata, 0, rows, n, NULL);
    const int raw = (t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q5_0 || t == GGML_TYPE_Q8_0) && (f == ALL_HIGH || f == ALL_LOW);
    if (raw) { /* fp16 d, then the quants: Q4_0 16 bytes of nibbles, Q5_0 4 of fifth bits and 16 of nibbles, Q8_0 32 int8 */
        const int qbytes = t == GGML_TYPE_Q4_0 ? 16 : t == GGML_TYPE_Q5_0 ? 20 : 32;
        for (int i = 0; i < rows * n / 32; i++) {
            uint8_t * b = (uint8_t *) wdata + (size_t) i * (2 + qbytes);
            const uint16_t d = ggml_fp32_to_fp16(frand(0.01f, 0.05f));
            memcpy(b, &d, 2);
            memset(b + 2, f == ALL_HIGH ? (t == GGML_TYPE_Q8_0 ? 0x7F : 0xFF) : (t == GGML_TYPE_Q8_0 ? 0x80 : 0x00), qbytes);
        }
    }
    if (t == GGML_TYPE_Q6_K && (f == ALL_HIGH || f == ALL_LOW)) { /* ql[128], qh[64], int8 scales[16], fp16 d */
        for (int i = 0; i < rows * n / 256; i++) {
            uint8_t * b = (uint8_t *) wdata + (size_t) i * 210;
            memset(b, f == ALL_HIGH ? 0xFF : 0x00, 192); /* every code 63, or 0 (weight -32) */
            memset(b + 192, f == ALL_HIGH ? 0x7F : 0x80, 16); /* every scale 127, or -128 */
            const uint16_t d = ggml_fp32_to_fp16(frand(0.0001f, 0.0005f));
            memcpy(b + 208, &d, 2);
        }
    }
    if (t == GGML_TYPE_Q5_K && (f == ALL_HIGH || f == ALL_LOW)) { /* fp16 d and dmin, scales[12], qh[32], qs[128] */
        for (int i = 0; i < rows * n / 256; i++) {
            uint8_t * b = (uint8_t *) wdata + (size_t) i * 176;
            const uint16_t d = ggml_fp32_to_fp16(frand(0.0001f, 0.0005f)), dmin = ggml_fp32_to_fp16(frand(0.0001f, 0.0005f));
            memcpy(b, &d, 2);
            memcpy(b + 2, &dmin, 2);
            memset(b + 4, 0xFF, 12); /* every scale and min 63 */
            memset(b + 16, f == ALL_HIGH ? 0xFF : 0x00, 160); /* every code 31, or 0 */
        }
    }
    const int pm1 = raw || ((t == GGML_TYPE_Q6_K || t == GGML_TYPE_Q5_K) && (f == ALL_HIGH || f == ALL_LOW)); /* +-1 activations */
    struct ggml_init_params ip = { 64 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_context * wctx = NULL;
    ggml_backend_buffer_t wbuf = NULL;
    struct ggml_tensor * w;
    if (repacked) {
        w = new_repacked_weight(t, n, rows, &wctx, &wbuf);
        if (!w) { /* this CPU's backend does not rearrange the type: nothing to check there */
            ggml_free(ctx);
            free(wdata);
            free(wf);
            return;
        }
        ggml_backend_tensor_set(w, wdata, 0, ggml_nbytes(w));
    } else {
        w = ggml_new_tensor_2d(ctx, t, n, rows);
        memcpy(w->data, wdata, ggml_nbytes(w));
    }
    struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, batch);
    float * af = (float *) a->data;
    for (int i = 0; i < n * batch; i++) af[i] = pm1 ? ((rnd() & 1) ? 1.0f : -1.0f) : frand(-1.0f, 1.0f);
    struct ggml_tensor * out = ggml_mul_mat(ctx, w, a);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) {
        FAIL("%s %s mul_mat n=%d rows=%d batch=%d: compute failed", ggml_type_name(t), path, n, rows, batch);
    } else {
        float * wd = malloc(sizeof(float) * (size_t) n);
        float * ad = malloc(sizeof(float) * (size_t) n);
        char * aq = malloc(ggml_row_size(vt, n));
        const float * of = (const float *) out->data;
        for (int c = 0; c < batch; c++) {
            vtc->from_float(af + (size_t) c * n, aq, n);
            vtt->to_float(aq, ad, n);
            for (int r = 0; r < rows; r++) {
                double mag;
                const double want = dequant_dot(tt, wdata + r * wrow, ad, wd, n, &mag);
                const float got = of[(size_t) c * rows + r];
                if (!near_dequant(got, want, mag)) {
                    FAIL("%s %s mul_mat n=%d rows=%d batch=%d threads=%d: [%d,%d] %.9g, reference %.9g", ggml_type_name(t),
                         path, n, rows, batch, threads, r, c, got, want);
                    c = batch;
                    break;
                }
            }
        }
        if (batch > 1) { /* each column alone, through the decode path, within the same bound of the batched one */
            struct ggml_tensor * a1 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, 1);
            struct ggml_tensor * o1 = ggml_mul_mat(ctx, w, a1);
            struct ggml_cgraph * g1 = ggml_new_graph(ctx);
            ggml_build_forward_expand(g1, o1);
            for (int c = 0; c < batch; c++) {
                memcpy(a1->data, af + (size_t) c * n, sizeof(float) * (size_t) n);
                ggml_graph_compute_with_ctx(ctx, g1, threads);
                const float * one = (const float *) o1->data;
                int bad = -1;
                for (int r = 0; r < rows && bad < 0; r++) {
                    const float b = of[(size_t) c * rows + r];
                    if (exact ? memcmp(&one[r], &b, sizeof(float)) != 0 : !(fabsf(one[r] - b) <= 1e-4f * (fabsf(b) + 1.0f))) bad = r;
                }
                if (bad >= 0) {
                    FAIL("%s %s mul_mat n=%d rows=%d batch=%d threads=%d: column %d row %d is %.9g alone, %.9g in the batch",
                         ggml_type_name(t), path, n, rows, batch, threads, c, bad, one[bad], of[(size_t) c * rows + bad]);
                    break;
                }
            }
        }
        free(aq);
        free(ad);
        free(wd);
    }
    if (wbuf) ggml_backend_buffer_free(wbuf);
    if (wctx) ggml_free(wctx);
    ggml_free(ctx);
    free(wdata);
    free(wf);
}

static void check_generic_mul_mat(enum ggml_type t, int n, int rows, int batch, int threads, int repacked) {
    check_generic_mul_mat_fill(t, n, rows, batch, threads, repacked, 0, RANDOM);
}

/* Patch 0020's tile layouts, read back from the repack buffer: per 32-weight block the 16 rows'
 * scales, then for Q4_0 byte 64 g + 4 r + t = row r's code of weight 8 g + t (low nibble) and
 * 8 g + 4 + t (high), for Q8_0 byte 64 s + 4 r + t = row r's weight 4 s + t plus 128. Patch
 * 0023's Q5_0: the scales, then bit 4 r + t of qword s = the fifth bit of row r's code of weight
 * 4 s + t, then Q4_0's nibbles. 1 when the weights of 16 rows are laid out so, 0 otherwise
 * (another layout, or not repacked). */
static int k_in_rows16_tiles(enum ggml_type t);
static int in_rows16_tiles(enum ggml_type t) {
    if (t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K || t == GGML_TYPE_Q6_K) return k_in_rows16_tiles(t);
    enum { N = 64, ROWS = 16, NB = N / 32, MAXB = 34 };
    const int bb = t == GGML_TYPE_Q4_0 ? 18 : t == GGML_TYPE_Q5_0 ? 22 : 34; /* block bytes: fp16 d, then the quants */
    const int nibbles_at = t == GGML_TYPE_Q5_0 ? 96 : 32; /* in a tile block: Q5_0's fifth bits come first */
    struct ggml_context * wctx;
    ggml_backend_buffer_t wbuf;
    struct ggml_tensor * w = new_repacked_weight(t, N, ROWS, &wctx, &wbuf);
    if (!w) return 0;
    uint8_t plain[ROWS * NB * MAXB], tiles[ROWS * NB * MAXB];
    const size_t nbytes = (size_t) ROWS * NB * bb;
    for (size_t i = 0; i < nbytes; i++) plain[i] = (uint8_t) rnd();
    for (int i = 0; i < ROWS * NB; i++) memcpy(plain + bb * i, &(uint16_t){ ggml_fp32_to_fp16(0.25f + i) }, 2);
    ggml_backend_tensor_set(w, plain, 0, nbytes);
    memcpy(tiles, w->data, nbytes); /* the repack buffer is host memory; get_tensor would not undo the layout */
    int ok = 1;
    for (int b = 0; b < NB && ok; b++) {
        const uint8_t * tile = tiles + (size_t) b * ROWS * bb;
        for (int r = 0; r < ROWS && ok; r++) {
            const uint8_t * in = plain + (size_t) (r * NB + b) * bb;
            if (memcmp(tile + 2 * r, in, 2) != 0) ok = 0;
            for (int s = 0; s < 8; s++)
                for (int k = 0; k < 4; k++) {
                    const int j = 4 * s + k; /* weight j of the block */
                    if (t == GGML_TYPE_Q8_0) {
                        if (tile[32 + 64 * s + 4 * r + k] != (uint8_t) (in[2 + j] + 128)) ok = 0;
                        continue;
                    }
                    const uint8_t * qs = in + (t == GGML_TYPE_Q5_0 ? 6 : 2);
                    const int code = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
                    const int at = nibbles_at + 64 * (s / 2) + 4 * r + k; /* steps 2g (low nibbles), 2g + 1 (high) */
                    if (((tile[at] >> (4 * (s % 2))) & 15) != code) ok = 0;
                    if (t == GGML_TYPE_Q5_0) {
                        const int bit = 4 * r + k, fifth = (in[2 + j / 8] >> (j % 8)) & 1;
                        if (((tile[32 + 8 * s + bit / 8] >> (bit % 8)) & 1) != fifth) ok = 0;
                    }
                }
        }
    }
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    return ok;
}

/* The K-quants' tiles open with the 16 rows' fp16 d (upstream's 8x8 layouts with eight rows'):
 * then, for patch 0022's Q4_K and 0025's Q5_K, their dmin; for 0024's Q6_K, their int8 scales
 * (byte 16 s + r: row r's scale of sub-block s; a plain Q6_K block is ql[128], qh[64],
 * scales[16], d). 1 when a weight of 16 rows is laid out so. */
static int k_in_rows16_tiles(enum ggml_type t) {
    enum { N = 256, ROWS = 16, MAXBB = 210 };
    const int q6 = t == GGML_TYPE_Q6_K;
    const int BB = (int) ggml_type_size(t), d_at = q6 ? 208 : 0; /* where a plain block keeps d */
    struct ggml_context * wctx;
    ggml_backend_buffer_t wbuf;
    struct ggml_tensor * w = new_repacked_weight(t, N, ROWS, &wctx, &wbuf);
    if (!w) return 0;
    uint8_t plain[ROWS * MAXBB];
    for (size_t i = 0; i < sizeof(plain); i++) plain[i] = (uint8_t) rnd();
    for (int r = 0; r < ROWS; r++) { /* finite scales: d = 0.25 + r, (Q4_K, Q5_K) dmin = 0.5 + r */
        const uint16_t d = ggml_fp32_to_fp16(0.25f + r), dmin = ggml_fp32_to_fp16(0.5f + r);
        memcpy(plain + r * BB + d_at, &d, 2);
        if (!q6) memcpy(plain + r * BB + 2, &dmin, 2);
    }
    ggml_backend_tensor_set(w, plain, 0, (size_t) ROWS * BB);
    const uint8_t * tile = (const uint8_t *) w->data;
    int ok = 1;
    for (int r = 0; r < ROWS; r++) {
        if (memcmp(tile + 2 * r, plain + r * BB + d_at, 2) != 0) ok = 0;
        if (!q6 && memcmp(tile + 32 + 2 * r, plain + r * BB + 2, 2) != 0) ok = 0;
        for (int sb = 0; q6 && sb < 16; sb++)
            if (tile[32 + 16 * sb + r] != plain[r * BB + 192 + sb]) ok = 0;
    }
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    return ok;
}

/* GGML_OP_MUL_MAT_ID (a mixture of experts: 3-D weights, each token's rows picked by ids) on
 * weights the repack buffer holds. Patch 0020: rows16's traits compute MUL_MAT alone, so a 3-D
 * weight it claimed was read by the plain kernels as if not repacked; it now leaves 3-D weights
 * alone (Q4_0 keeps upstream's 8x8 layout, which computes both ops). A type the buffer does not
 * take in 3-D is nothing to check. Reference: ggml's dequantization, as check_generic_mul_mat. */
static void check_mul_mat_id(enum ggml_type t, int n, int rows, int threads) {
    enum { N_AS = 4, N_USED = 2, N_TOK = 3 };
    ggml_backend_buffer_type_t buft = repack_buffer_type();
    const struct ggml_type_traits * tt = ggml_get_type_traits(t);
    if (!buft || !tt->to_float) return;
    struct ggml_init_params wp = { ggml_tensor_overhead() * 2, NULL, true };
    struct ggml_context * wctx = ggml_init(wp);
    struct ggml_tensor * as = ggml_new_tensor_3d(wctx, t, n, rows, N_AS);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    if (!wbuf || !as->extra) { /* not taken in 3-D: such weights stay in a plain buffer */
        if (wbuf) ggml_backend_buffer_free(wbuf);
        ggml_free(wctx);
        return;
    }
    const size_t wrow = ggml_row_size(t, n);
    char * wdata = malloc(wrow * (size_t) rows * N_AS);
    if (t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q5_0 || t == GGML_TYPE_Q6_K) {
        float * wf = malloc(sizeof(float) * (size_t) n * rows * N_AS);
        for (int i = 0; i < n * rows * N_AS; i++) wf[i] = frand(-1.0f, 1.0f);
        ggml_quantize_chunk(t, wf, wdata, 0, rows * N_AS, n, NULL);
        free(wf);
    } else {
        fill_weights(t, wdata, rows * N_AS, n, RANDOM);
    }
    ggml_backend_tensor_set(as, wdata, 0, ggml_nbytes(as));
    struct ggml_init_params ip = { 16 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * b = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n, N_USED, N_TOK);
    struct ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, N_USED, N_TOK);
    float * bf = (float *) b->data;
    for (int i = 0; i < n * N_USED * N_TOK; i++) bf[i] = frand(-1.0f, 1.0f);
    for (int k = 0; k < N_TOK; k++) {
        ((int32_t *) ids->data)[k * N_USED] = k % N_AS;
        ((int32_t *) ids->data)[k * N_USED + 1] = (k + 1 + k % 2) % N_AS;
    }
    struct ggml_tensor * out = ggml_mul_mat_id(ctx, as, b, ids);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) {
        FAIL("%s repacked mul_mat_id n=%d rows=%d: compute failed", ggml_type_name(t), n, rows);
    } else {
        const enum ggml_type vt = ggml_get_type_traits_cpu(t)->vec_dot_type;
        char * aq = malloc(ggml_row_size(vt, n));
        float * ad = malloc(sizeof(float) * (size_t) n);
        float * wd = malloc(sizeof(float) * (size_t) n);
        int bad = 0;
        for (int k = 0; k < N_TOK && !bad; k++)
            for (int u = 0; u < N_USED && !bad; u++) {
                const int e = ((int32_t *) ids->data)[k * N_USED + u];
                ggml_get_type_traits_cpu(vt)->from_float(bf + (size_t) (k * N_USED + u) * n, aq, n);
                ggml_get_type_traits(vt)->to_float(aq, ad, n);
                for (int r = 0; r < rows && !bad; r++) {
                    double mag;
                    const double want = dequant_dot(tt, wdata + ((size_t) e * rows + r) * wrow, ad, wd, n, &mag);
                    const float got = ((const float *) out->data)[((size_t) k * N_USED + u) * rows + r];
                    if (!near_dequant(got, want, mag)) {
                        FAIL("%s repacked mul_mat_id n=%d rows=%d threads=%d: token %d expert %d row %d %.9g, reference %.9g "
                             "(3-D weights read in a layout they are not in?)", ggml_type_name(t), n, rows, threads, k, e, r, got, want);
                        bad = 1;
                    }
                }
            }
        free(aq);
        free(ad);
        free(wd);
    }
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    ggml_free(ctx);
    free(wdata);
}

int main(int argc, char ** argv) {
    int expect_x86 = 0, results_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "quick") == 0) quick = 1;
        else if (strcmp(argv[i], "results-only") == 0) results_only = 1;
        else expect_x86 = 1;
    }
    ggml_cpu_init();
    const int x86_avx2 = ggml_cpu_has_avx2();
    const struct ggml_type_traits_cpu * q1 = ggml_get_type_traits_cpu(GGML_TYPE_Q1_0);
    const struct ggml_type_traits_cpu * q2 = ggml_get_type_traits_cpu(GGML_TYPE_Q2_0);
    /* patch 0011 repacks sixteen rows at a time on x86: 16 rows are, 4 are not (ARM's upstream
     * layout repacks Q1_0 four rows at a time: there `repacked` says so for 16 rows too) */
    const int q1_repacked = repacks(GGML_TYPE_Q1_0, 384, 16);
    const int q2_repacked = repacks(GGML_TYPE_Q2_0, 192, 16);
    const int q1_rows4 = repacks(GGML_TYPE_Q1_0, 384, 4);
    const int ptq1 = has_ptq1_0();
    const int ptq1_repacked = ptq1 && repacks(PTQ1_0, 384, 16);
    const int q2_rows4 = repacks(GGML_TYPE_Q2_0, 192, 4);
    const int q4_rows16 = in_rows16_tiles(GGML_TYPE_Q4_0);
    const int q8_rows16 = in_rows16_tiles(GGML_TYPE_Q8_0);
    const int q4k_rows16 = in_rows16_tiles(GGML_TYPE_Q4_K);
    const int q5_rows16 = in_rows16_tiles(GGML_TYPE_Q5_0);
    const int q6k_rows16 = in_rows16_tiles(GGML_TYPE_Q6_K);
    const int q5k_rows16 = in_rows16_tiles(GGML_TYPE_Q5_K);
    const int dpbusd = ggml_cpu_has_avx512_vnni() || ggml_cpu_has_avx_vnni(); /* compiled in */
    printf("avx2=%d avx512=%d avx512_vnni=%d avx_vnni=%d q1_0.nrows=%lld q2_0.nrows=%lld q2_0.generic=%s q1_0.repacked=%d "
           "q2_0.repacked=%d q1_0.rows4=%d q2_0.rows4=%d ptq1_0=%d ptq1_0.repacked=%d acts128=%d q4_0.rows16=%d q8_0.rows16=%d "
           "q4_K.rows16=%d q5_0.rows16=%d q6_K.rows16=%d q5_K.rows16=%d\n",
           x86_avx2, ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vnni(), ggml_cpu_has_avx_vnni(), (long long) q1->nrows,
           (long long) q2->nrows, ggml_vec_dot_q2_0_q8_0_generic ? "own symbol" : "absent", q1_repacked, q2_repacked, q1_rows4, q2_rows4, ptq1, ptq1_repacked,
           ggml_rows16_quantize_acts128 != NULL, q4_rows16, q8_rows16, q4k_rows16, q5_rows16, q6k_rows16, q5k_rows16);
    if ((expect_x86 || x86_avx2) && !results_only) { /* `x86`: expect the x86 kernels even where the probe says no */
        cur_type = GGML_TYPE_Q2_0;
        if (!ggml_vec_dot_q2_0_q8_0_generic) {
            FAIL("Q2_0 has no x86 kernel: its vec_dot is the scalar reference (patch 0005 missing)");
        } else if ((void *) q2->vec_dot == (void *) ggml_vec_dot_q2_0_q8_0_generic) {
            FAIL("Q2_0's vec_dot is the scalar reference on an AVX2 build (patch 0005 not selected)");
        }
        cur_type = q1->nrows != 2 ? GGML_TYPE_Q1_0 : GGML_TYPE_Q2_0;
        if (q1->nrows != 2 || q2->nrows != 2) {
            FAIL("Q1_0/Q2_0 do one row a call (nrows %lld/%lld), not 2x2 (patch 0006 missing)", (long long) q1->nrows,
                 (long long) q2->nrows);
        }
        cur_type = GGML_TYPE_Q1_0;
        if (!q1_repacked) {
            FAIL("Q1_0 weights are not repacked: the x86 sixteen-row kernels are not offered (patch 0011 missing)");
        } else if (q1_rows4) {
            FAIL("Q1_0 weights of 4 rows are repacked: the four-row layout is offered, not patch 0011's sixteen-row one");
        }
        if (q1_repacked && !ggml_rows16_quantize_acts128) {
            FAIL("Q1_0's repacked kernels take Q8_0 activations, four scales per block (patch 0018 missing)");
        }
        cur_type = GGML_TYPE_Q2_0;
        if (!q2_repacked) {
            FAIL("Q2_0 weights are not repacked: the x86 sixteen-row kernels are not offered (patch 0011 missing)");
        } else if (q2_rows4) {
            FAIL("Q2_0 weights of 4 rows are repacked: the four-row layout is offered, not patch 0011's sixteen-row one");
        }
        cur_type = PTQ1_0;
        if (!ptq1) {
            FAIL("PTQ1_0 (type 143) is not a type of this build (patch 0012 missing)");
        } else if (!ptq1_repacked) {
            FAIL("PTQ1_0 weights are not repacked: the x86 sixteen-row kernels are not offered (patch 0012 missing)");
        }
        /* the tile types with Q8_0 activations: each in the tiles on x86 with AVX2 (Q8_0 by 0020 where
         * the build has dpbusd, by 0026 where it multiplies with maddubs) */
        const struct { enum ggml_type t; const char * name; int in_tiles; const char * patch; } tiled_wiring[] = {
            { GGML_TYPE_Q4_0, "Q4_0", q4_rows16, "0020" }, { GGML_TYPE_Q8_0, "Q8_0", q8_rows16, dpbusd ? "0020" : "0026" },
            { GGML_TYPE_Q4_K, "Q4_K", q4k_rows16, "0022" }, { GGML_TYPE_Q5_0, "Q5_0", q5_rows16, "0023" },
            { GGML_TYPE_Q6_K, "Q6_K", q6k_rows16, "0024" }, { GGML_TYPE_Q5_K, "Q5_K", q5k_rows16, "0025" },
        };
        for (size_t i = 0; i < sizeof(tiled_wiring) / sizeof(tiled_wiring[0]); i++) {
            cur_type = tiled_wiring[i].t;
            if (!tiled_wiring[i].in_tiles) {
                FAIL("%s weights of 16 rows are not in the sixteen-row tiles: a 5-column batch runs upstream's kernels "
                     "(patch %s missing)", tiled_wiring[i].name, tiled_wiring[i].patch);
            }
        }
    }
    const enum ggml_type types[] = { GGML_TYPE_Q1_0, GGML_TYPE_Q2_0, PTQ1_0 };
    const int ntypes = ptq1 ? 3 : 2;
    for (int ti = 0; ti < ntypes; ti++) {
        const enum ggml_type t = types[ti];
        cur_type = t;
        check_vec_dot(t);
        const int n = 3 * per_block(t);
        const int row_counts[] = { 2, 17, 34 };
        const int batches[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33 };
        for (int ri = quick ? 1 : 0; ri < 3; ri++)
            for (int bi = 0; bi < 12; bi++)
                for (int th = 1; th <= 2; th++)
                    if (!quick || (bi + th) % 2 == 0 || bi >= 9) check_mul_mat(t, n, row_counts[ri], batches[bi], th, 0);
        check_mul_mat(t, 2048, 64, 5, 2, 0);
    }
    for (int ti = 0; ti < ntypes; ti++) { /* rows come in tiles of 16 there; 48 splits three tiles over two threads */
        const enum ggml_type t = types[ti];
        cur_type = t;
        if (!(t == GGML_TYPE_Q1_0 ? q1_repacked : t == GGML_TYPE_Q2_0 ? q2_repacked : ptq1_repacked)) continue;
        const int per = per_block(t);
        const int row_counts[] = { 16, 48, 64 };
        const int batches[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 33 };
        for (int ri = quick ? 1 : 0; ri < 3; ri++)
            for (int bi = 0; bi < 18; bi++)
                for (int th = 1; th <= 2; th++)
                    if (!quick || (bi + th) % 2 == 0 || bi >= 15) check_mul_mat(t, 3 * per, row_counts[ri], batches[bi], th, 1);
        check_mul_mat(t, 2048, 64, 5, 2, 1);
        check_mul_mat(t, 2048, 64, 17, 2, 1); /* many blocks through the AMX tiles (patch 0014) */
        check_mul_mat(t, per, 16, 9, 2, 1); /* one block per row */
        check_mul_mat(t, 2 * per, 1040, 5, 2, 1); /* 65 tiles: patch 0021 repacks them on two or more threads */
    }
    /* patch 0014: on an AMX-INT8 build the batches of 8+ columns above went through the tiles */
    const int amx_calls = ggml_rows16_amx_calls ? ggml_rows16_amx_calls() : -2;
    printf("amx_int8=%d rows16.amx_calls=%d\n", ggml_cpu_has_amx_int8(), amx_calls);
    if (ggml_cpu_has_amx_int8() && (expect_x86 || x86_avx2) && !results_only) {
        cur_type = GGML_TYPE_Q1_0;
        if (amx_calls == -2) {
            FAIL("batches of 8+ columns do not take the AMX tiles on an AMX-INT8 build (patch 0014 missing)");
        } else if (amx_calls == 0) {
            FAIL("no batch of 8+ columns took the AMX tiles although they can run (patch 0014's dispatch)");
        }
    }
    const enum ggml_type tiled[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K, GGML_TYPE_Q5_K };
    for (int ti = 0; ti < 6; ti++) { /* patches 0020, 0022-0026: every batch against the reference, each column bit-identical alone */
        const enum ggml_type t = tiled[ti];
        const int in_tiles = t == GGML_TYPE_Q4_0 ? q4_rows16 : t == GGML_TYPE_Q8_0 ? q8_rows16 : t == GGML_TYPE_Q4_K ? q4k_rows16
                           : t == GGML_TYPE_Q5_0 ? q5_rows16 : t == GGML_TYPE_Q6_K ? q6k_rows16 : q5k_rows16;
        if (!in_tiles) continue;
        const int kquant = t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K || t == GGML_TYPE_Q6_K; /* 256-weight super-blocks */
        cur_type = t;
        const int row_counts[] = { 16, 48, 64 };
        const int batches[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 33 };
        for (int ri = quick ? 1 : 0; ri < 3; ri++)
            for (int bi = 0; bi < 18; bi++)
                for (int th = 1; th <= 2; th++)
                    if (!quick || (bi + th) % 2 == 0 || bi >= 15) {
                        const int k = row_counts[ri] + batches[bi];
                        check_generic_mul_mat_fill(t, kquant ? 512 : 256, row_counts[ri], batches[bi], th, 1, 1,
                                                   k % 5 == 0 ? ALL_HIGH : k % 7 == 0 ? ALL_LOW : RANDOM);
                    }
        check_generic_mul_mat_fill(t, 2048, 64, 5, 2, 1, 1, RANDOM);
        check_generic_mul_mat_fill(t, 2048, 64, 17, 2, 1, 1, ALL_HIGH);
        check_generic_mul_mat_fill(t, kquant ? 256 : 32, 16, 9, 2, 1, 1, RANDOM); /* one block per row */
        check_generic_mul_mat_fill(t, kquant ? 256 : 64, 1040, 5, 2, 1, 1, RANDOM); /* 65 tiles: several threads (0021) */
    }
    { /* 3-D weights in the repack buffer (patch 0020) */
        const enum ggml_type moe[] = { GGML_TYPE_Q1_0, GGML_TYPE_Q2_0, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K, PTQ1_0 };
        for (int ti = 0; ti < (ptq1 ? 6 : 5); ti++) {
            cur_type = moe[ti];
            check_mul_mat_id(moe[ti], moe[ti] == GGML_TYPE_Q2_0 ? 192 : moe[ti] == GGML_TYPE_Q6_K ? 512 : 384, 32, 2);
        }
    }
    const enum ggml_type others[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_F16, GGML_TYPE_Q5_0 };
    for (int ti = 0; ti < 4; ti++) {
        const enum ggml_type t = others[ti];
        cur_type = t;
        const int row_counts[] = { 3, 16, 40 };
        const int batches[] = { 1, 2, 3, 4, 5, 7, 8, 9, 16, 17 };
        for (int rep = 0; rep <= 1; rep++)
            for (int ri = quick ? 1 : 0; ri < 3; ri++)
                for (int bi = 0; bi < 10; bi++) check_generic_mul_mat(t, 256, row_counts[ri], batches[bi], 1 + (bi % 2), rep);
    }
    const enum ggml_type all[] = { GGML_TYPE_Q1_0, GGML_TYPE_Q2_0, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_F16, GGML_TYPE_Q4_K,
                                   GGML_TYPE_Q5_0, GGML_TYPE_Q6_K, GGML_TYPE_Q5_K };
    for (int ti = 0; ti < 9; ti++) {
        if (type_failures[all[ti]]) printf("type %s failed %d\n", ggml_type_name(all[ti]), type_failures[all[ti]]);
        else printf("type %s ok\n", ggml_type_name(all[ti]));
    }
    /* PTQ1_0: checked where the build has the type; a build of ours without it failed above */
    if (type_failures[PTQ1_0]) printf("type ptq1_0 failed %d\n", type_failures[PTQ1_0]);
    else if (ptq1) printf("type ptq1_0 ok\n");
    if (failures) {
        printf("%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
