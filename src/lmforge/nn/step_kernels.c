/* lmforge's CPU kernels, a decoding step's work besides the products (kernels.c, float_kernels.c): e^x, RMSNorm,
 * the step's attention over each row's cache, and a pre-LN decoder's whole layer stack in one call, float32
 * throughout (the cache may hold its keys and values as IEEE half floats: written rounded to nearest, read back
 * exactly). Built with the other two into one library (nn/kernels.py); the same rule: a row's bits depend
 * only on its own token and cache, and the plain-C build (no AVX-512) computes the same bits.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define LANES 16

/* kernels.c's and float_kernels.c's products: y (m, n) = residual + x (m, k) Ŵᵀ + bias */
void lmforge_int4_mm(const float *x, int64_t m, int64_t k, const uint8_t *w, const uint32_t *sz, int64_t n,
                     const float *bias, const float *residual, float *y, int threads);
void lmforge_int8_mm(const float *x, int64_t m, int64_t k, const int8_t *w, const uint16_t *scales, int64_t n,
                     const float *bias, const float *residual, float *y, int threads);
void lmforge_int8_q8_mm(const float *x, int64_t m, int64_t k, const int8_t *w, const uint16_t *scales, int64_t n,
                        const float *bias, const float *residual, float *y, int threads);
void lmforge_f32_mm(const float *x, int64_t m, int64_t k, const float *w, int64_t n, const float *bias,
                    const float *residual, float *y, int threads);

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

/* acc (dh) += sum_c e_c V_c over n columns in order, lane by lane (a head's weighted values; the sums carried in
 * acc from one block of columns to the next) */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void weigh_vectors(const float *e, const float *values, int64_t n,
                                                               const int vectors, float *acc) {
    __m512 a[8];  /* held in registers within a block: the sums never go through memory column by column */
    for (int v = 0; v < vectors; v++) a[v] = _mm512_loadu_ps(acc + v * LANES);
    for (int64_t c = 0; c < n; c++) {
        const __m512 weight = _mm512_set1_ps(e[c]);
        for (int v = 0; v < vectors; v++)
            a[v] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(values + (c * vectors + v) * LANES), a[v]);
    }
    for (int v = 0; v < vectors; v++) _mm512_storeu_ps(acc + v * LANES, a[v]);
}
#endif

static void weigh_values(const float *e, const float *values, int64_t n, int64_t dh, float *acc) {
#if defined(__AVX512F__)
    switch (dh) {  /* the usual head widths, unrolled */
    case 32: weigh_vectors(e, values, n, 2, acc); return;
    case 64: weigh_vectors(e, values, n, 4, acc); return;
    case 128: weigh_vectors(e, values, n, 8, acc); return;
    default: break;
    }
#endif
    for (int64_t c = 0; c < n; c++)
        for (int64_t i = 0; i < dh; i++) acc[i] = __builtin_fmaf(e[c], values[c * dh + i], acc[i]);
}

/* row[c] = scale * dot(q, keys[c]) for every column: ``dot``'s bits, 16 columns at a time where the vectors allow.
 * Each column's 16 lane sums are made as ``dot`` makes them; then the 16 columns' lanes are reduced together, the
 * tree pairing lanes l and l + 8, then l and l + 4, l and l + 2, l and l + 1 within every column, as ``dot``'s
 * halving and (l0 + l2) + (l1 + l3) do: 15 shuffled adds for 16 columns instead of 16 horizontal sums. The last
 * level leaves column c in lane ORDER[c] (an involution), which one permutation puts back. */
static void score_columns(const float *q, const float *keys, int64_t columns, int64_t dh, float scale, float *row) {
    int64_t c = 0;
#if defined(__AVX512F__)
    if (dh % LANES == 0 && dh <= 8 * LANES) {
        const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
        const int vectors = (int)(dh / LANES);
        __m512 qv[8];
        for (int v = 0; v < vectors; v++) qv[v] = _mm512_loadu_ps(q + v * LANES);
        for (; c + LANES <= columns; c += LANES) {
            __m512 p[LANES], u[8], t[4], w[2];
            for (int j = 0; j < LANES; j++) {
                const float *k = keys + (c + j) * dh;
                p[j] = _mm512_setzero_ps();
                for (int v = 0; v < vectors; v++) p[j] = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(k + v * LANES), p[j]);
            }
            for (int j = 0; j < 8; j++)  /* lanes l + l + 8: columns j and j + 8 side by side */
                u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(p[j], p[j + 8], 0x44),
                                     _mm512_shuffle_f32x4(p[j], p[j + 8], 0xEE));
            for (int j = 0; j < 4; j++)  /* l + l + 4 */
                t[j] = _mm512_add_ps(_mm512_shuffle_f32x4(u[j], u[j + 4], 0x88),
                                     _mm512_shuffle_f32x4(u[j], u[j + 4], 0xDD));
            for (int j = 0; j < 2; j++)  /* l + l + 2 */
                w[j] = _mm512_add_ps(_mm512_shuffle_ps(t[j], t[j + 2], 0x44), _mm512_shuffle_ps(t[j], t[j + 2], 0xEE));
            const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
            _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_permutexvar_ps(order, sums)));
        }
    }
#endif
    for (; c < columns; c++) row[c] = scale * dot(q, keys + c * dh, dh);
}

/* x[i] = h[i] for i < n: half floats widened to float32 (exactly; F16C's instruction where there is AVX-512, as
 * gcc calls a library function for a plain conversion) */
static inline void widen(const _Float16 *restrict h, int64_t n, float *restrict x) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + LANES <= n; i += LANES)
        _mm512_storeu_ps(x + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
#endif
    for (; i < n; i++) x[i] = (float)h[i];
}

/* h[i] = x[i] rounded to the nearest half float (ties to even), i < n */
static inline void narrow(const float *restrict x, int64_t n, _Float16 *restrict h) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + LANES <= n; i += LANES)
        _mm256_storeu_si256((__m256i *)(h + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) h[i] = (_Float16)x[i];
}

/* columns [c, c + n) of a head's keys or values as float32: the cache's own, or (half) widened into ``wide`` */
static inline const float *columns_at(const void *cache, int64_t c, int64_t n, int64_t dh, int half, float *wide) {
    if (!half) return (const float *)cache + c * dh;
    widen((const _Float16 *)cache + c * dh, n * dh, wide);
    return wide;
}

/* out (group, dh) = softmax(scale q K^T) V for a key/value head's query heads q (group, dh), keys and values
 * (columns, dh): scores, their maximum, the exponentials' sum and the weighted values each in column order. A
 * cache of half floats (half) is read LANES columns at a time, widened into a block that stays in the L1 cache:
 * the same operations in the same order as over a float32 cache holding the same numbers, so the same bits, at
 * half the bytes read; a float32 cache is read whole. */
static void attend(const float *restrict queries, int64_t group, const void *keys, const void *values,
                   int64_t columns, int64_t dh, float scale, int half, float *restrict out) {
    const int64_t block = half ? LANES : columns;
    float *restrict scores = __builtin_malloc(group * columns * sizeof(float));
    float wide[LANES * dh], acc[group * dh], total[group];
    for (int64_t c = 0; c < columns; c += block) {
        const int64_t n = columns - c < block ? columns - c : block;
        const float *k = columns_at(keys, c, n, dh, half, wide);
        for (int64_t j = 0; j < group; j++) score_columns(queries + j * dh, k, n, dh, scale, scores + j * columns + c);
    }
    for (int64_t j = 0; j < group; j++) {
        float *restrict row = scores + j * columns, top = -__builtin_inff();
        for (int64_t c = 0; c < columns; c++) top = row[c] > top ? row[c] : top;
        for (int64_t c = 0; c < columns; c++) row[c] = row[c] - top;
        exp_all(row, columns, row);
        total[j] = 0;
        for (int64_t c = 0; c < columns; c++) total[j] += row[c];
    }
    for (int64_t i = 0; i < group * dh; i++) acc[i] = 0;
    for (int64_t c = 0; c < columns; c += block) {
        const int64_t n = columns - c < block ? columns - c : block;
        const float *v = columns_at(values, c, n, dh, half, wide);
        for (int64_t j = 0; j < group; j++) weigh_values(scores + j * columns + c, v, n, dh, acc + j * dh);
    }
    for (int64_t j = 0; j < group; j++)
        for (int64_t i = 0; i < dh; i++) out[j * dh + i] = acc[j * dh + i] / total[j];
    __builtin_free(scores);
}

/* One decoding step's attention for rows b < rows, each one new token at column lengths[b] of slot first + b:
 *   qkv (rows, h + 2 hkv, dh)      the token's query, key and value heads (its in-projection)
 *   cos, sin (positions, dh)       rotary tables (sin with rotate_half's sign: its first half negated), or NULL
 *   kv (2, slots, hkv, capacity, dh)  the layer's cache, float32 or (half) IEEE half floats: the rotated keys and
 *                                  the values are written at the column (half: rounded to nearest), the columns
 *                                  0..lengths[b] read back as float32 (exactly)
 *   out (rows, h dh)               softmax(scale q K^T) V over columns 0..lengths[b], query head j reading key/value
 *                                  head j / (h / hkv)
 * The query heads are rotated in place in qkv. Scores, their maximum, the exponentials' sum and the weighted values
 * are each summed in column order: a row's bits depend on nothing but its own token and cache. */
void lmforge_decode_attention(float *qkv, int64_t rows, int64_t h, int64_t hkv, int64_t dh, const float *cos,
                              const float *sin, const int64_t *lengths, void *kv, int64_t slots, int64_t capacity,
                              int64_t first, float scale, float *out, int half, int threads) {
    const int64_t heads = h + 2 * hkv, half_dh = dh / 2, plane = slots * hkv * capacity * dh;
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
                for (int64_t i = 0; i < half_dh; i++) turned[i] = x[i] * turn_cos[i] + x[i + half_dh] * turn_sin[i];
                for (int64_t i = half_dh; i < dh; i++) turned[i] = x[i] * turn_cos[i] + x[i - half_dh] * turn_sin[i];
                memcpy(x, turned, sizeof turned);
            }
        }
        const int64_t head = ((first + b) * hkv + g) * capacity * dh;  /* the key head's; its values a plane on */
        const float *queries = qkv + (b * heads + g * group) * dh;
        float *o = out + (b * h + g * group) * dh;
        void *keys, *values;  /* the new key and value at column `at` (half: rounded as torch's .to(float16)) */
        if (half) {
            keys = (_Float16 *)kv + head, values = (_Float16 *)keys + plane;
            narrow(key, dh, (_Float16 *)keys + at * dh);
            narrow(value, dh, (_Float16 *)values + at * dh);
        } else {
            keys = (float *)kv + head, values = (float *)keys + plane;
            memcpy((float *)keys + at * dh, key, dh * sizeof(float));
            memcpy((float *)values + at * dh, value, dh * sizeof(float));
        }
        attend(queries, group, keys, values, columns, dh, scale, half, o);
    }
}

/* ---- a pre-LN decoder's layers, one token a row, in one call ----------------------------------------------- */
/* The lean step's layer (generation/lean.py) for a model whose products all run on these kernels (quantized, or
 * float32 with the CPU runner's copy), RMSNorm, SwiGLU:
 *     x = x + W_o attend(norm1(x))
 *     x = x + W_2 (silu(g) ⊙ u),  [g, u] = W_1 norm2(x)
 * each piece the function above it in this file, so its bits are those of the calls made one by one (but SwiGLU,
 * whose exponential is this file's, not torch's). Python's work between the pieces is all that is saved. */
typedef struct {
    const void *weight, *scales;  /* a QuantizedLinear in kernels.c's layout, or float_kernels.c's weight */
    const float *bias;            /* or NULL */
    int64_t n, k, kind;           /* out, in features; 8, 9 (int8, 8-bit activations), 4 or 32 (float32:
                                     weight only, scales NULL) */
} product_t;

typedef struct {
    const float *norm1, *norm2;     /* RMSNorm gains (D,) */
    product_t qkv, out, up, down;   /* in_proj ((H + 2 H_kv) d, D), out_proj (D, H d), fc1 (2 F, D), fc2 (D, F) */
} layer_t;

static void product(const product_t *p, const float *x, int64_t m, const float *residual, float *y, int threads) {
    if (p->kind == 32)
        lmforge_f32_mm(x, m, p->k, p->weight, p->n, p->bias, residual, y, threads);
    else if (p->kind == 4)
        lmforge_int4_mm(x, m, p->k, p->weight, p->scales, p->n, p->bias, residual, y, threads);
    else if (p->kind == 9)
        lmforge_int8_q8_mm(x, m, p->k, p->weight, p->scales, p->n, p->bias, residual, y, threads);
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

/* x (rows, D) through every layer, in place; kv (L, 2, slots, hkv, capacity, dh) the layers' caches (half: IEEE
 * half floats); scratch of rows * (2 D + (h + 2 hkv) dh + h dh + 3 F) floats */
void lmforge_decode_layers(float *x, int64_t rows, const layer_t *layers, int64_t n_layers, float eps, int64_t h,
                           int64_t hkv, int64_t dh, const float *cos, const float *sin, const int64_t *lengths,
                           void *kv, int64_t slots, int64_t capacity, int64_t first, float scale, float *scratch,
                           int half, int threads) {
    const int64_t d = layers[0].out.n, f = layers[0].down.k, plane = 2 * slots * hkv * capacity * dh;
    float *normed = scratch, *heads = normed + rows * d, *attended = heads + rows * (h + 2 * hkv) * dh;
    float *hidden = attended + rows * h * dh, *gated = hidden + rows * 2 * f;
    for (int64_t l = 0; l < n_layers; l++) {
        const layer_t *layer = layers + l;
        lmforge_rms_norm(x, rows, d, layer->norm1, eps, normed);
        product(&layer->qkv, normed, rows, NULL, heads, threads);
        void *layer_kv = half ? (void *)((_Float16 *)kv + l * plane) : (void *)((float *)kv + l * plane);
        lmforge_decode_attention(heads, rows, h, hkv, dh, cos, sin, lengths, layer_kv, slots, capacity, first,
                                 scale, attended, half, threads);
        product(&layer->out, attended, rows, x, x, threads);
        lmforge_rms_norm(x, rows, d, layer->norm2, eps, normed);
        product(&layer->up, normed, rows, NULL, hidden, threads);
        swiglu(hidden, rows, f, gated);
        product(&layer->down, gated, rows, x, x, threads);
    }
}
