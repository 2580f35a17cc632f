/* lmforge's CPU kernels: weight-only quantized products, y = residual + x Ŵᵀ + b (x and y float32, Ŵ (N, K));
 * a decoding step's other work (RMSNorm, attention, the whole layer stack) is step_kernels.c and a float32
 * model's products float_kernels.c, all built into one library.
 *
 * Compiled on the machine that runs it (nn/kernels.py: cc -O3 -march=native -fopenmp), loaded with ctypes.
 *
 *   int8   Ŵ[n][i] = s[n][b] q[n][i]                     q int8, b = i / 32, s bfloat16
 *   int4   Ŵ[n][i] = s[n][b] (q[n][i] - 8) + z[n][b]     q in [0, 15], b = i / 32, s and z bfloat16
 *
 * The outputs go in tiles of 16 rows of Ŵ, the 16 lanes of one vector, so no lanes are ever summed together: the
 * weights of a tile are laid out so that one dot-product instruction takes 16 rows' next few inputs (each
 * section below gives its layout). x is first rounded a block of 32 inputs at a time (``quantize_rows``: int4 to
 * 8 bits, llama.cpp's scheme; int8 to 16), so each block's sums are exact integers, and each block then adds to
 * an output by fused multiply-adds in block order. The order of an output's sums is fixed by the layout alone: an
 * output depends only on its row of x and its row of Ŵ, never on how many rows of x are computed together nor
 * on how the threads split the tiles (the engine's rule: a request alone has the bits it has in a batch). A
 * tile's weights are unpacked once for eight rows of x (XROWS). Where the CPU lacks AVX-512 VNNI, plain C loops compute
 * the same sums in the same order: the same bits.
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
#define XROWS 8   /* rows of x a tile's unpacked weights are used for at once */
#define PREFETCH 8192
#define INT8_Q8 9  /* a kind beside 4 and 8: int8 weights by 8-bit activations */

/* the 4 bytes at p as one int32 (a broadcast operand: the compiler reads it within the dot-product instruction) */
static inline int32_t four_bytes(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

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
                    __m512i n = _mm512_cvtps_epi32(
                        _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
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
/* Σ q xq over a block's 32 inputs for 16 rows at once, exact: q[g] holds the rows' inputs 4g .. 4g + 3 as unsigned
 * bytes, xq the row of x's 32 signed ones (four at a time broadcast from memory within the instruction) */
static inline __attribute__((always_inline)) __m512i byte_products(const __m512i q[8], const int8_t *xq) {
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    for (int g = 0; g < 8; g += 2) {
        even = _mm512_dpbusd_epi32(even, q[g], _mm512_set1_epi32(four_bytes(xq + 4 * g)));
        odd = _mm512_dpbusd_epi32(odd, q[g + 1], _mm512_set1_epi32(four_bytes(xq + 4 * g + 4)));
    }
    return _mm512_add_epi32(even, odd);
}

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
            const __m512 total = _mm512_cvtepi32_ps(byte_products(q, a->q + (row + r) * k + 32 * b));  /* S */
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
            const float s = bf16_float((uint16_t)pair);
            const float m = __builtin_fmaf(-8.0f, s, bf16_float((uint16_t)(pair >> 16)));
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
/* block b of an int8 tile: its weights' lines PREFETCH bytes ahead asked for, its 16 rows' scales as float32 */
static inline __m512 int8_block(const int8_t *w, const uint16_t *scales, int64_t b) {
    for (int line = 0; line < 512; line += 64)
        _mm_prefetch((const char *)(w + 512 * b + PREFETCH + line), _MM_HINT_T0);
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(scales + 16 * b))), 16));
}

static inline __attribute__((always_inline)) void int8_tile(const quantized_t *a, int64_t row, const int t,
                                                            int64_t k, const int8_t *w, const uint16_t *scales,
                                                            __m512 *out) {
    __m512 acc[XROWS];
    for (int r = 0; r < t; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / 32; b++) {
        const __m512 s = int8_block(w, scales, b);
        __m512i sums[XROWS];
        for (int r = 0; r < t; r++) sums[r] = _mm512_setzero_si512();
        for (int j = 0; j < 16; j++) {  /* pairs of inputs: 16 rows' 2 weights, widened to 16 bits */
            const __m512i q = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + 512 * b + 32 * j)));
            for (int r = 0; r < t; r++) {
                sums[r] = _mm512_dpwssd_epi32(sums[r], q, _mm512_set1_epi32(
                    four_bytes(a->q16 + (row + r) * k + 32 * b + 2 * j)));
            }
        }
        for (int r = 0; r < t; r++) {
            const __m512 total = _mm512_cvtepi32_ps(sums[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(a->d[(row + r) * (k / 32) + b]), s), total, acc[r]);
        }
    }
    for (int r = 0; r < t; r++) out[r] = acc[r];
}
#endif

/* int8 weights, 8-bit activations (an int4 model's int8 head: llama.cpp's Q8_0 by Q8 products): the same layout,
 * xq of 8 bits (limit 127). Two pairs of inputs side by side (vpermw: word 2r from the first 32 bytes, 2r + 1 from
 * the next) make each lane four consecutive inputs of one row, flipped to unsigned (q + 128) for the unsigned-by-
 * signed byte products: 64 multiply-adds an instruction, twice int8_tile's. A block's S' = Σ (q + 128) xq = T + 128 X,
 * so T = S' - 128 X, exact in float32 (|S'| < 2^20); d s T added by one fused multiply-add, in block order. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
static inline __attribute__((always_inline)) void int8_q8_tile(const quantized_t *a, int64_t row, const int t,
                                                               int64_t k, const int8_t *w, const uint16_t *scales,
                                                               __m512 *out) {
    const __m512i side_by_side = _mm512_setr_epi32(0x100000, 0x110001, 0x120002, 0x130003, 0x140004, 0x150005,
                                                   0x160006, 0x170007, 0x180008, 0x190009, 0x1A000A, 0x1B000B,
                                                   0x1C000C, 0x1D000D, 0x1E000E, 0x1F000F);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[XROWS];
    for (int r = 0; r < t; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / 32; b++) {
        const __m512 s = int8_block(w, scales, b);
        __m512i q[8];  /* q[g]: the 16 rows' inputs 4g .. 4g + 3 of the block, q + 128 a byte each */
        for (int g = 0; g < 8; g++)
            q[g] = _mm512_xor_si512(_mm512_permutexvar_epi16(side_by_side, _mm512_loadu_si512(w + 512 * b + 64 * g)),
                                    flip);
        for (int r = 0; r < t; r++) {
            const __m512i sums = byte_products(q, a->q + (row + r) * k + 32 * b);
            const __m512 total = _mm512_sub_ps(_mm512_cvtepi32_ps(sums),
                                               _mm512_set1_ps(128.0f * a->sum[(row + r) * (k / 32) + b]));
            const __m512 d = _mm512_set1_ps(a->d[(row + r) * (k / 32) + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, s), total, acc[r]);
        }
    }
    for (int r = 0; r < t; r++) out[r] = acc[r];
}
#endif

/* the portable loops: one row of x's sums for one tile (acc[lane]), in the order the vector code keeps (int8
 * weights by 16-bit activations, or by 8-bit ones: ``bits``) */
static inline void int8_row(const quantized_t *a, int64_t row, int64_t k, const int8_t *w, const uint16_t *scales,
                            const int bits, float acc[LANES]) {
    for (int l = 0; l < LANES; l++) acc[l] = 0;
    for (int64_t b = 0; b < k / 32; b++) {
        const int64_t at = row * k + 32 * b;
        const float d = a->d[row * (k / 32) + b];
        for (int l = 0; l < LANES; l++) {
            int32_t total = 0;
            for (int i = 0; i < 32; i++)
                total += (int32_t)w[512 * b + 32 * (i / 2) + 2 * l + i % 2] *
                         (bits == 8 ? a->q[at + i] : a->q16[at + i]);
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
    else int8_row(a, row, k, w, scales, kind == INT8_Q8 ? 8 : 16, acc);
}

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void tile_products(const quantized_t *a, int64_t row, const int t,
                                                                int64_t k, const void *w, const void *scales,
                                                                const int kind, __m512 *out) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    if (kind == 4) int4_tile(a, row, t, k, w, scales, out);
    else if (kind == INT8_Q8) int8_q8_tile(a, row, t, k, w, scales, out);
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
        case 8: tile_products(a, r, 8, k, w, scales, kind, out); break;
        case 7: tile_products(a, r, 7, k, w, scales, kind, out); break;
        case 6: tile_products(a, r, 6, k, w, scales, kind, out); break;
        case 5: tile_products(a, r, 5, k, w, scales, kind, out); break;
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
    const int64_t bytes = kind == 8 ? 2 : 1;  /* an activation's: 16 bits (int8) or 8 */
    char *memory = __builtin_malloc(m * k * bytes + 2 * m * (k / 32) * sizeof(float));
    float *blocks = (float *)(memory + m * k * bytes);
    const quantized_t a = {(int8_t *)memory, (int16_t *)memory, blocks, blocks + m * (k / 32)};
    quantize_rows(x, m, k, a, kind == 8 ? 32767 : 127);
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

void lmforge_int8_q8_mm(const float *x, int64_t m, int64_t k, const int8_t *w, const uint16_t *scales, int64_t n,
                        const float *bias, const float *residual, float *y, int threads) {
    quantized_mm(x, m, k, w, scales, n, bias, residual, y, INT8_Q8, threads);
}
