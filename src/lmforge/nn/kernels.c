/* lmforge's CPU kernels: weight-only quantized products, y = residual + x Ŵᵀ + b (x and y float32, Ŵ (N, K)), and
 * a decoding step's RMSNorm, attention and whole layer stack (the sections after the products).
 *
 * Compiled on the machine that runs it (nn/kernels.py: cc -O3 -march=native -fopenmp), loaded with ctypes.
 *
 *   int8   Ŵ[n][i] = s[n][b] q[n][i]                     q int8, b = i / 32, s bfloat16
 *   int4   Ŵ[n][i] = s[n][b] (q[n][i] - 8) + z[n][b]     q in [0, 15], b = i / 32, s and z bfloat16
 *
 * The outputs go in tiles of 16 rows of Ŵ, the 16 lanes of one vector, so no lanes are ever summed together: the
 * weights of a tile are stored input by input (each section below gives its layout), and each input multiplies
 * the 16 rows' weights by one broadcast value of x. The order of an output's sums is fixed by the layout alone: an
 * output depends only on its row of x and its row of Ŵ, never on how many rows of x are computed together nor
 * on how the threads split the tiles (the engine's rule: a request alone has the bits it has in a batch). A
 * tile's weights are unpacked once for four rows of x. int8 keeps x float32; int4 rounds x to 8 bits a block of
 * 32 first and sums each block in integers (its section). Where the CPU lacks AVX-512 (or VNNI, for int4), plain
 * C loops compute the same sums in the same order: the same bits.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define LANES 16

static inline float bf16_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- int4 ------------------------------------------------------------------------------------------------ */
/* Layout: for tile t and block b of 32 inputs, 256 bytes in 4 chunks of 64: byte 4r + e of chunk c holds
 * q[16t + r][32b + 8c + e] in its low 4 bits and q[16t + r][32b + 8c + 4 + e] in its high 4 bits (each 64 bytes
 * is 16 rows' 4 consecutive inputs: one dot-product instruction's operand); sz[t][b][r] the (s, z) bfloat16 pair
 * of row 16t + r, block b.
 * The activations are quantized per block of 32 inputs first (``quantize_rows``): x ≈ d xq with d = max |x| / 127
 * and xq int8 (llama.cpp's Q8 activations; their rounding, at most d / 2 an input, is ~1/16 of int4's weight
 * rounding). Then each block's sums are integers, exact in any order: S = Σ q xq (unsigned by signed bytes, four a
 * lane an instruction) and X = Σ xq, and since Ŵ = s (q - 8) + z, a block adds d s S + d m X with m = z - 8 s: two
 * fused multiply-adds a block, in block order. */
#define XROWS 4   /* rows of x a tile's unpacked weights are used for at once */
#define PREFETCH 8192

typedef struct {
    int8_t *q;      /* (m, k) xq, 8 bits (int4's products) */
    int16_t *q16;   /* or 16 bits (int8's) */
    float *d, *sum; /* (m, k / 32) each: the block's d and X = Σ xq */
} quantized_t;

/* x (m, k) -> its blocks' xq (a.q with limit 127, a.q16 with 32767), d = max |x| / limit and X; a block holding
 * NaN gets d = NaN (its products NaN, as in float) */
static void quantize_rows(const float *x, int64_t m, int64_t k, quantized_t a, const int limit) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t b = 0; b < k / 32; b++) {
            const float *xb = x + r * k + 32 * b;
            float amax = 0;
            int nan = 0;
#if defined(__AVX512F__)
            const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
            nan = (_mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q)) != 0;
            amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
#else
            for (int i = 0; i < 32; i++) {
                const float v = __builtin_fabsf(xb[i]);
                amax = v > amax ? v : amax;
                nan |= xb[i] != xb[i];
            }
#endif
            const float inverse = amax > 0 ? (float)limit / amax : 0.0f;
            int32_t q[32], total = 0;
            if (nan) {
                memset(q, 0, sizeof q);
            } else {
#if defined(__AVX512F__)
                for (int h = 0; h < 2; h++) {
                    const __m512 v = _mm512_mul_ps(h ? v1 : v0, _mm512_set1_ps(inverse));
                    __m512i n = _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                    n = _mm512_min_epi32(_mm512_max_epi32(n, _mm512_set1_epi32(-limit)), _mm512_set1_epi32(limit));
                    _mm512_storeu_si512(q + 16 * h, n);
                    total += _mm512_reduce_add_epi32(n);
                }
#else
                for (int i = 0; i < 32; i++) {
                    float v = __builtin_rintf(xb[i] * inverse);
                    v = v > limit ? limit : v < -limit ? -limit : v;
                    q[i] = (int32_t)v;
                    total += q[i];
                }
#endif
            }
            for (int i = 0; i < 32; i++) {
                if (limit == 127) a.q[r * k + 32 * b + i] = (int8_t)q[i];
                else a.q16[r * k + 32 * b + i] = (int16_t)q[i];
            }
            a.d[r * (k / 32) + b] = nan ? __builtin_nanf("") : amax / (float)limit;
            a.sum[r * (k / 32) + b] = (float)total;
        }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
static inline __attribute__((always_inline)) void int4_tile(const quantized_t *a, int64_t row, const int t,
                                                            int64_t k, const uint8_t *w, const uint32_t *sz,
                                                            __m512 *out) {
    const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 acc[XROWS];
    for (int r = 0; r < t; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / 32; b++) {
        for (int line = 0; line < 256; line += 64)  /* PREFETCH bytes ahead (the next tile's too) */
            _mm_prefetch((const char *)(w + 256 * b + PREFETCH + line), _MM_HINT_T0);
        _mm_prefetch((const char *)(sz + 16 * b + PREFETCH / 4), _MM_HINT_T0);
        const __m512i pairs = _mm512_loadu_si512(sz + 16 * b);
        const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
        const __m512 m = _mm512_fmadd_ps(_mm512_set1_ps(-8.0f), s, _mm512_castsi512_ps(_mm512_and_si512(pairs, high)));
        __m512i q[8];  /* q[g]: the 16 rows' inputs 4g .. 4g + 3 of the block, a byte each */
        for (int c = 0; c < 4; c++) {
            const __m512i bytes = _mm512_loadu_si512(w + 256 * b + 64 * c);
            q[2 * c] = _mm512_and_si512(bytes, low);
            q[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
        }
        for (int r = 0; r < t; r++) {
            const int8_t *xq = a->q + (row + r) * k + 32 * b;
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
            for (int g = 0; g < 8; g += 2) {
                int32_t four[2];
                memcpy(four, xq + 4 * g, sizeof four);
                even = _mm512_dpbusd_epi32(even, q[g], _mm512_set1_epi32(four[0]));
                odd = _mm512_dpbusd_epi32(odd, q[g + 1], _mm512_set1_epi32(four[1]));
            }
            const __m512 total = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));  /* S, exact */
            const __m512 d = _mm512_set1_ps(a->d[(row + r) * (k / 32) + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, s), total, acc[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, m), _mm512_set1_ps(a->sum[(row + r) * (k / 32) + b]), acc[r]);
        }
    }
    for (int r = 0; r < t; r++) out[r] = acc[r];
}
#endif

/* the portable loops: one row of x's sums for one tile (acc[lane]), in the order the vector code keeps */
static inline void int4_row(const quantized_t *a, int64_t row, int64_t k, const uint8_t *w, const uint32_t *sz,
                            float acc[LANES]) {
    for (int l = 0; l < LANES; l++) acc[l] = 0;
    for (int64_t b = 0; b < k / 32; b++) {
        const int8_t *xq = a->q + row * k + 32 * b;
        const float d = a->d[row * (k / 32) + b], sum = a->sum[row * (k / 32) + b];
        for (int l = 0; l < LANES; l++) {
            const uint32_t pair = sz[16 * b + l];
            const float s = bf16_float((uint16_t)pair), m = __builtin_fmaf(-8.0f, s, bf16_float((uint16_t)(pair >> 16)));
            int32_t total = 0;
            for (int c = 0; c < 4; c++)
                for (int e = 0; e < 4; e++) {
                    const uint8_t byte = w[256 * b + 64 * c + 4 * l + e];
                    total += (byte & 15) * xq[8 * c + e] + (byte >> 4) * xq[8 * c + 4 + e];
                }
            acc[l] = __builtin_fmaf(d * s, (float)total, acc[l]);
            acc[l] = __builtin_fmaf(d * m, sum, acc[l]);
        }
    }
}

/* ---- int8 ------------------------------------------------------------------------------------------------ */
/* Layout: for tile t and pair j (inputs 2j, 2j + 1), 32 bytes: byte 2r + e = q[16t + r][2j + e]; s[t][b][r] the
 * bfloat16 scale of row 16t + r, block b of 32 inputs. The activations are quantized to 16 bits a block (d =
 * max |x| / 32767: 256 times finer than int4's 8, as fine as SmolLM2's perplexity can tell from float32; 8 bits
 * moved int8's by 0.5%); a block's sum T = Σ q xq is exact in 32-bit integers (16-bit pairs, two a lane an
 * instruction), T in float32 (rounded once past 2^24) and d s T added by one fused multiply-add, in block order. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
static inline __attribute__((always_inline)) void int8_tile(const quantized_t *a, int64_t row, const int t,
                                                            int64_t k, const int8_t *w, const uint16_t *scales,
                                                            __m512 *out) {
    __m512 acc[XROWS];
    for (int r = 0; r < t; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / 32; b++) {
        for (int line = 0; line < 512; line += 64)
            _mm_prefetch((const char *)(w + 512 * b + PREFETCH + line), _MM_HINT_T0);
        const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(scales + 16 * b))), 16));
        __m512i even[XROWS], odd[XROWS];
        for (int r = 0; r < t; r++) even[r] = odd[r] = _mm512_setzero_si512();
        for (int j = 0; j < 16; j += 2) {  /* pairs of inputs: 16 rows' 2 weights, widened to 16 bits */
            const __m512i q0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + 512 * b + 32 * j)));
            const __m512i q1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + 512 * b + 32 * j + 32)));
            for (int r = 0; r < t; r++) {
                const int16_t *xq = a->q16 + (row + r) * k + 32 * b + 2 * j;
                int32_t two[2];
                memcpy(two, xq, sizeof two);
                even[r] = _mm512_dpwssd_epi32(even[r], q0, _mm512_set1_epi32(two[0]));
                odd[r] = _mm512_dpwssd_epi32(odd[r], q1, _mm512_set1_epi32(two[1]));
            }
        }
        for (int r = 0; r < t; r++) {
            const __m512 total = _mm512_cvtepi32_ps(_mm512_add_epi32(even[r], odd[r]));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(a->d[(row + r) * (k / 32) + b]), s), total, acc[r]);
        }
    }
    for (int r = 0; r < t; r++) out[r] = acc[r];
}
#endif

/* the portable loops: one row of x's sums for one tile (acc[lane]), in the order the vector code keeps */
static inline void int8_row(const quantized_t *a, int64_t row, int64_t k, const int8_t *w, const uint16_t *scales,
                            float acc[LANES]) {
    for (int l = 0; l < LANES; l++) acc[l] = 0;
    for (int64_t b = 0; b < k / 32; b++) {
        const int16_t *xq = a->q16 + row * k + 32 * b;
        const float d = a->d[row * (k / 32) + b];
        for (int l = 0; l < LANES; l++) {
            int32_t total = 0;
            for (int i = 0; i < 32; i++) total += (int32_t)w[512 * b + 32 * (i / 2) + 2 * l + i % 2] * xq[i];
            acc[l] = __builtin_fmaf(d * bf16_float(scales[16 * b + l]), (float)total, acc[l]);
        }
    }
}

/* ---- a tile's outputs, either kind ----------------------------------------------------------------------- */
/* y[r][16 tile ..] = residual + (the tile's products + bias) for every row r of x, from its quantized form a */
static inline __attribute__((always_inline)) void row_sums(const quantized_t *a, int64_t row, int64_t k,
                                                           const void *w, const void *scales, const int kind,
                                                           float acc[LANES]) {
    if (kind == 4) int4_row(a, row, k, w, scales, acc);
    else int8_row(a, row, k, w, scales, acc);
}

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void tile_products(const quantized_t *a, int64_t row, const int t,
                                                                int64_t k, const void *w, const void *scales,
                                                                const int kind, __m512 *out) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    if (kind == 4) int4_tile(a, row, t, k, w, scales, out);
    else int8_tile(a, row, t, k, w, scales, out);
#else
    for (int r = 0; r < t; r++) {
        float acc[LANES];
        row_sums(a, row + r, k, w, scales, kind, acc);
        out[r] = _mm512_loadu_ps(acc);
    }
#endif
}

static inline __attribute__((always_inline)) void tile_rows(const quantized_t *a, int64_t m, int64_t k,
                                                            const void *w, const void *scales, const int kind,
                                                            int64_t n, int64_t tile, const float *bias,
                                                            const float *residual, float *y) {
    for (int64_t r = 0; r < m; r += XROWS) {
        const int64_t t = m - r < XROWS ? m - r : XROWS;
        __m512 out[XROWS];
        switch (t) {  /* a constant count of rows for each call: the sums stay in registers */
        case 4: tile_products(a, r, 4, k, w, scales, kind, out); break;
        case 3: tile_products(a, r, 3, k, w, scales, kind, out); break;
        case 2: tile_products(a, r, 2, k, w, scales, kind, out); break;
        default: tile_products(a, r, 1, k, w, scales, kind, out);
        }
        for (int i = 0; i < t; i++) {
            __m512 v = out[i];
            if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + 16 * tile));
            if (residual) v = _mm512_add_ps(_mm512_loadu_ps(residual + (r + i) * n + 16 * tile), v);
            _mm512_storeu_ps(y + (r + i) * n + 16 * tile, v);
        }
    }
}
#else
static void tile_rows(const quantized_t *a, int64_t m, int64_t k, const void *w, const void *scales, const int kind,
                      int64_t n, int64_t tile, const float *bias, const float *residual, float *y) {
    for (int64_t r = 0; r < m; r++) {
        float v[LANES];
        row_sums(a, r, k, w, scales, kind, v);
        for (int l = 0; l < LANES; l++) {
            float o = v[l];
            if (bias) o = o + bias[16 * tile + l];
            if (residual) o = residual[r * n + 16 * tile + l] + o;
            y[r * n + 16 * tile + l] = o;
        }
    }
}
#endif

/* y (m, n) = residual + x (m, k) Ŵᵀ + bias (n a multiple of 16, k of 32; bias, residual may be NULL) for either
 * kind: x quantized once, then the tiles split among the threads */
static void quantized_mm(const float *x, int64_t m, int64_t k, const void *w, const void *scales, int64_t n,
                         const float *bias, const float *residual, float *y, const int kind, int threads) {
    const int64_t bytes = kind == 4 ? 1 : 2;  /* an activation's: 8 or 16 bits */
    char *memory = __builtin_malloc(m * k * bytes + 2 * m * (k / 32) * sizeof(float));
    float *blocks = (float *)(memory + m * k * bytes);
    const quantized_t a = {(int8_t *)memory, (int16_t *)memory, blocks, blocks + m * (k / 32)};
    quantize_rows(x, m, k, a, kind == 4 ? 127 : 32767);
    const int64_t tile_bytes = kind == 4 ? 8 * k : 16 * k, tile_scales = 16 * (k / 32) * (kind == 4 ? 4 : 2);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t tile = 0; tile < n / 16; tile++)
        tile_rows(&a, m, k, (const char *)w + tile * tile_bytes, (const char *)scales + tile * tile_scales, kind, n,
                  tile, bias, residual, y);
    __builtin_free(memory);
}

void lmforge_int4_mm(const float *x, int64_t m, int64_t k, const uint8_t *w, const uint32_t *sz, int64_t n,
                     const float *bias, const float *residual, float *y, int threads) {
    quantized_mm(x, m, k, w, sz, n, bias, residual, y, 4, threads);
}

void lmforge_int8_mm(const float *x, int64_t m, int64_t k, const int8_t *w, const uint16_t *scales, int64_t n,
                     const float *bias, const float *residual, float *y, int threads) {
    quantized_mm(x, m, k, w, scales, n, bias, residual, y, 8, threads);
}

/* ---- a decoding step's other work (float32) -------------------------------------------------------------- */
/* e^x in float32, this file's own (glibc's expf is scalar): x clamped to [-87.33654, 88], n = rint(x log2 e),
 * r = x - n ln 2 (ln 2 in two parts, Cody and Waite), e^r by a degree-7 polynomial (Cephes' expf coefficients,
 * within 2 ulp), times 2^n from its exponent bits. Each step is one correctly rounded operation or fused
 * multiply-add, the same in the vector and the scalar form: both builds give the same bits. NaN stays NaN. */
#define EXP_LO -87.33654f
#define EXP_HI 88.0f
static const float exp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                                  1.6666665459e-1f, 5.0000001201e-1f};

static inline float exp_one(float x) {
    if (x != x) return x;
    x = x < EXP_LO ? EXP_LO : x;
    x = x > EXP_HI ? EXP_HI : x;
    const float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = __builtin_fmaf(n, -0.693359375f, x);
    r = __builtin_fmaf(n, 2.12194440e-4f, r);
    float p = exp_poly[0];
    for (int i = 1; i < 6; i++) p = __builtin_fmaf(p, r, exp_poly[i]);
    const float y = __builtin_fmaf(p, r * r, r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return y * two_n;
}

#if defined(__AVX512F__)
static inline __m512 exp16(__m512 x) {
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ), x, _mm512_set1_ps(EXP_LO));
    x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_HI), _CMP_GT_OQ), x, _mm512_set1_ps(EXP_HI));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(exp_poly[0]);
    for (int i = 1; i < 6; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_poly[i]));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mask_blend_ps(nan, _mm512_mul_ps(y, _mm512_castsi512_ps(bits)), x);
}
#endif

/* y[i] = e^x[i], i < n (y may be x) */
static void exp_all(const float *x, int64_t n, float *y) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + LANES <= n; i += LANES) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = exp_one(x[i]);
}

void lmforge_exp(const float *x, int64_t n, float *y) { exp_all(x, n, y); }

/* sum_i a_i b_i over n values: 16 lanes, each in order, then the lanes halved three times and the last four
 * summed as (l0 + l2) + (l1 + l3) */
#if defined(__AVX512F__)
static inline float dot(const float *a, const float *b, int64_t n) {
    __m512 lane = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) lane = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), lane);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        lane = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), lane, m);
    }
    const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lane), 1));  /* lanes 8..15 */
    __m256 half = _mm256_add_ps(_mm512_castps512_ps256(lane), upper);
    __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    __m128 pairs = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));  /* (l0 + l2, l1 + l3, ..) */
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}
#else
static inline float dot(const float *a, const float *b, int64_t n) {
    float lane[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) lane[l] = __builtin_fmaf(a[i + l], b[i + l], lane[l]);
    for (int l = 0; i + l < n; l++) lane[l] = __builtin_fmaf(a[i + l], b[i + l], lane[l]);
    float half[LANES / 2];
    for (int l = 0; l < LANES / 2; l++) half[l] = lane[l] + lane[l + LANES / 2];
    float quarter[LANES / 4];
    for (int l = 0; l < LANES / 4; l++) quarter[l] = half[l] + half[l + LANES / 4];
    return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}
#endif

/* y (m, d) = x / sqrt(mean(x^2) + eps) * w, row by row */
void lmforge_rms_norm(const float *x, int64_t m, int64_t d, const float *w, float eps, float *y) {
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + r * d;
        const float inv = 1.0f / __builtin_sqrtf(dot(xr, xr, d) / (float)d + eps);
        for (int64_t i = 0; i < d; i++) y[r * d + i] = xr[i] * inv * w[i];
    }
}

/* o (dh) = sum_c e_c V_c / total over the columns in order, lane by lane (a head's weighted values) */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void weigh_vectors(const float *e, const float *values, int64_t columns,
                                                               const int vectors, float total, float *o) {
    __m512 acc[8];  /* held in registers: the sums never go through memory column by column */
    for (int v = 0; v < vectors; v++) acc[v] = _mm512_setzero_ps();
    for (int64_t c = 0; c < columns; c++) {
        const __m512 weight = _mm512_set1_ps(e[c]);
        for (int v = 0; v < vectors; v++)
            acc[v] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(values + (c * vectors + v) * LANES), acc[v]);
    }
    for (int v = 0; v < vectors; v++) _mm512_storeu_ps(o + v * LANES, _mm512_div_ps(acc[v], _mm512_set1_ps(total)));
}
#endif

static void weigh_values(const float *e, const float *values, int64_t columns, int64_t dh, float total, float *o) {
#if defined(__AVX512F__)
    switch (dh) {  /* the usual head widths, unrolled */
    case 32: weigh_vectors(e, values, columns, 2, total, o); return;
    case 64: weigh_vectors(e, values, columns, 4, total, o); return;
    case 128: weigh_vectors(e, values, columns, 8, total, o); return;
    default: break;
    }
#endif
    float acc[dh];
    for (int64_t i = 0; i < dh; i++) acc[i] = 0;
    for (int64_t c = 0; c < columns; c++)
        for (int64_t i = 0; i < dh; i++) acc[i] = __builtin_fmaf(e[c], values[c * dh + i], acc[i]);
    for (int64_t i = 0; i < dh; i++) o[i] = acc[i] / total;
}

/* out (group, dh) = softmax(scale q K^T) V for a key/value head's query heads q (group, dh), keys and values
 * (columns, dh): scores, their maximum, the exponentials' sum and the weighted values each in column order */
static void attend(const float *restrict queries, int64_t group, const float *restrict keys,
                   const float *restrict values, int64_t columns, int64_t dh, float scale, float *restrict out) {
    float *restrict scores = __builtin_malloc(group * columns * sizeof(float));
    for (int64_t j = 0; j < group; j++) {
        const float *restrict q = queries + j * dh;
        float *restrict row = scores + j * columns, top = -__builtin_inff(), total = 0;
        for (int64_t c = 0; c < columns; c++) {
            row[c] = scale * dot(q, keys + c * dh, dh);
            top = row[c] > top ? row[c] : top;
        }
        for (int64_t c = 0; c < columns; c++) row[c] = row[c] - top;
        exp_all(row, columns, row);
        for (int64_t c = 0; c < columns; c++) total += row[c];
        weigh_values(row, values, columns, dh, total, out + j * dh);
    }
    __builtin_free(scores);
}

/* One decoding step's attention for rows b < rows, each one new token at column lengths[b] of slot first + b:
 *   qkv (rows, h + 2 hkv, dh)      the token's query, key and value heads (its in-projection)
 *   cos, sin (positions, dh)       rotary tables (sin with rotate_half's sign: its first half negated), or NULL
 *   kv (2, slots, hkv, capacity, dh)  the layer's cache: the rotated keys and the values are written at the column
 *   out (rows, h dh)               softmax(scale q K^T) V over columns 0..lengths[b], query head j reading key/value
 *                                  head j / (h / hkv)
 * The query heads are rotated in place in qkv. Scores, their maximum, the exponentials' sum and the weighted values
 * are each summed in column order: a row's bits depend on nothing but its own token and cache. */
void lmforge_decode_attention(float *qkv, int64_t rows, int64_t h, int64_t hkv, int64_t dh, const float *cos,
                              const float *sin, const int64_t *lengths, float *kv, int64_t slots, int64_t capacity,
                              int64_t first, float scale, float *out, int threads) {
    const int64_t heads = h + 2 * hkv, half = dh / 2, plane = slots * hkv * capacity * dh;
    const int64_t group = h / hkv;  /* query heads a key/value head serves */
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t task = 0; task < rows * hkv; task++) {
        const int64_t b = task / hkv, g = task % hkv, columns = lengths[b] + 1, at = lengths[b];
        float *key = qkv + (b * heads + h + g) * dh, *value = key + hkv * dh;
        if (cos) {  /* x cos + rotate_half(x) sin, for the task's query heads and its key head */
            const float *turn_cos = cos + at * dh, *turn_sin = sin + at * dh;
            float turned[dh];
            for (int64_t j = 0; j <= group; j++) {
                float *x = j < group ? qkv + (b * heads + g * group + j) * dh : key;
                for (int64_t i = 0; i < half; i++) turned[i] = x[i] * turn_cos[i] + x[i + half] * turn_sin[i];
                for (int64_t i = half; i < dh; i++) turned[i] = x[i] * turn_cos[i] + x[i - half] * turn_sin[i];
                memcpy(x, turned, sizeof turned);
            }
        }
        float *cache = kv + ((first + b) * hkv + g) * capacity * dh;  /* the key head's; its values a plane on */
        memcpy(cache + at * dh, key, dh * sizeof(float));  /* the new key and value at column `at` */
        memcpy(cache + plane + at * dh, value, dh * sizeof(float));
        attend(qkv + (b * heads + g * group) * dh, group, cache, cache + plane, columns, dh, scale,
               out + (b * h + g * group) * dh);
    }
}

/* ---- a pre-LN decoder's layers, one token a row, in one call ----------------------------------------------- */
/* The lean step's layer (generation/lean.py) for a model whose products are all quantized, RMSNorm, SwiGLU:
 *     x = x + W_o attend(norm1(x))
 *     x = x + W_2 (silu(g) ⊙ u),  [g, u] = W_1 norm2(x)
 * each piece the function above it in this file, so its bits are those of the calls made one by one (but SwiGLU,
 * whose exponential is this file's, not torch's). Python's work between the pieces is all that is saved. */
typedef struct {
    const void *weight, *scales;  /* a QuantizedLinear in this file's layout */
    const float *bias;            /* or NULL */
    int64_t n, k, kind;           /* out, in features; 8 or 4 */
} product_t;

typedef struct {
    const float *norm1, *norm2;     /* RMSNorm gains (D,) */
    product_t qkv, out, up, down;   /* in_proj ((H + 2 H_kv) d, D), out_proj (D, H d), fc1 (2 F, D), fc2 (D, F) */
} layer_t;

static void product(const product_t *p, const float *x, int64_t m, const float *residual, float *y, int threads) {
    if (p->kind == 4)
        lmforge_int4_mm(x, m, p->k, p->weight, p->scales, p->n, p->bias, residual, y, threads);
    else
        lmforge_int8_mm(x, m, p->k, p->weight, p->scales, p->n, p->bias, residual, y, threads);
}

/* y (m, f) = silu(g) u = g / (1 + e^-g) u for hidden (m, 2 f) = [g | u] row by row (e^-g first, into y) */
static void swiglu(const float *hidden, int64_t m, int64_t f, float *y) {
    for (int64_t r = 0; r < m; r++) {
        const float *g = hidden + r * 2 * f, *u = g + f;
        float *out = y + r * f;
        for (int64_t i = 0; i < f; i++) out[i] = -g[i];
        exp_all(out, f, out);
        for (int64_t i = 0; i < f; i++) out[i] = g[i] / (1.0f + out[i]) * u[i];
    }
}

/* x (rows, D) through every layer, in place; kv (L, 2, slots, hkv, capacity, dh) the layers' caches; scratch of
 * rows * (2 D + (h + 2 hkv) dh + h dh + 3 F) floats */
void lmforge_decode_layers(float *x, int64_t rows, const layer_t *layers, int64_t n_layers, float eps, int64_t h,
                           int64_t hkv, int64_t dh, const float *cos, const float *sin, const int64_t *lengths,
                           float *kv, int64_t slots, int64_t capacity, int64_t first, float scale, float *scratch,
                           int threads) {
    const int64_t d = layers[0].out.n, f = layers[0].down.k, plane = 2 * slots * hkv * capacity * dh;
    float *normed = scratch, *heads = normed + rows * d, *attended = heads + rows * (h + 2 * hkv) * dh;
    float *hidden = attended + rows * h * dh, *gated = hidden + rows * 2 * f;
    for (int64_t l = 0; l < n_layers; l++) {
        const layer_t *layer = layers + l;
        lmforge_rms_norm(x, rows, d, layer->norm1, eps, normed);
        product(&layer->qkv, normed, rows, NULL, heads, threads);
        lmforge_decode_attention(heads, rows, h, hkv, dh, cos, sin, lengths, kv + l * plane, slots, capacity, first,
                                 scale, attended, threads);
        product(&layer->out, attended, rows, x, x, threads);
        lmforge_rms_norm(x, rows, d, layer->norm2, eps, normed);
        product(&layer->up, normed, rows, NULL, hidden, threads);
        swiglu(hidden, rows, f, gated);
        product(&layer->down, gated, rows, x, x, threads);
    }
}
