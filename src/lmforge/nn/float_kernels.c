/* lmforge's float32 product for a float32 model's decoding steps on a CPU (generation/runners/cpu.py: the CPU
 * runner's packed copy of each nn.Linear, and the one-call layer stack of step_kernels.c), y = residual + x Wᵀ + b.
 * Built with kernels.c and step_kernels.c into one library (nn/kernels.py); the same rule: an output's bits
 * depend only on its row of x and of W, and the plain-C build (no AVX-512) computes the same bits.
 */
#include <stdint.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define LANES 16
#define PREFETCH 8192

/* Layout: tiles of 16 output rows, input by input: w[t][i][r] = W[16t + r][i], float32 as given. Each output's sum
 * runs over the inputs in order in one accumulator, so its bits depend only on its row of x and of W, whichever
 * rows and tiles a call computes together. No rounding of x: a float32 model's products in a decoding step
 * (runners/cpu.py). One row of x (batch-1 decoding, bytes-bound): one tile at a time, the weights read as one stream
 * the hardware prefetcher follows (~10% faster on one thread than two prefetched streams); more rows (arithmetic-
 * bound): two tiles' weights (32 outputs) meet 8 rows of x, each x value broadcast once for both. */
#define F32_ROWS 8
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void f32_block(const float *x, int64_t k, const float *w0,
                                                            const float *w1, const int two, const int t,
                                                            float sums[2][F32_ROWS][LANES]) {
    __m512 a0[F32_ROWS], a1[F32_ROWS];
    for (int r = 0; r < t; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        if (two && (i & 3) == 0) {  /* two streams: a line of each every 4 inputs, ahead */
            _mm_prefetch((const char *)(w0 + 16 * i + PREFETCH / 2), _MM_HINT_T0);
            _mm_prefetch((const char *)(w1 + 16 * i + PREFETCH / 2), _MM_HINT_T0);
        }
        const __m512 v0 = _mm512_loadu_ps(w0 + 16 * i), v1 = two ? _mm512_loadu_ps(w1 + 16 * i) : v0;
        for (int r = 0; r < t; r++) {
            const __m512 xv = _mm512_set1_ps(x[r * k + i]);
            a0[r] = _mm512_fmadd_ps(xv, v0, a0[r]);
            if (two) a1[r] = _mm512_fmadd_ps(xv, v1, a1[r]);
        }
    }
    for (int r = 0; r < t; r++) {
        _mm512_storeu_ps(sums[0][r], a0[r]);
        if (two) _mm512_storeu_ps(sums[1][r], a1[r]);
    }
}
#endif

/* sums[h][r][l] = Σ_i x[r][i] · W[16 (t0 + h) + l][i] for t rows of x and one tile (two = 0) or two */
static void f32_sums(const float *x, int64_t k, const float *w0, const int two, const int t,
                     float sums[2][F32_ROWS][LANES]) {
#if defined(__AVX512F__)
    const float *w1 = w0 + 16 * k;
    if (t == 1 && !two) {  /* one row, one tile */
        __m512 a = _mm512_setzero_ps();
        for (int64_t i = 0; i < k; i++) a = _mm512_fmadd_ps(_mm512_set1_ps(x[i]), _mm512_loadu_ps(w0 + 16 * i), a);
        _mm512_storeu_ps(sums[0][0], a);
        return;
    }
    switch (2 * t + two) {  /* constants for each call: the sums stay in registers */
#define F32_CASE(T) case 2 * T + 1: f32_block(x, k, w0, w1, 1, T, sums); break; \
                    case 2 * T: f32_block(x, k, w0, w1, 0, T, sums); break;
    F32_CASE(8) F32_CASE(7) F32_CASE(6) F32_CASE(5) F32_CASE(4) F32_CASE(3) F32_CASE(2) F32_CASE(1)
#undef F32_CASE
    }
#else
    for (int h = 0; h <= two; h++)
        for (int r = 0; r < t; r++)
            for (int l = 0; l < LANES; l++) {
                float acc = 0;
                for (int64_t i = 0; i < k; i++) acc = __builtin_fmaf(x[r * k + i], w0[16 * (h * k + i) + l], acc);
                sums[h][r][l] = acc;
            }
#endif
}

/* y (m, n) = residual + x (m, k) Wᵀ + bias (n a multiple of 16); bias, residual may be NULL */
void lmforge_f32_mm(const float *x, int64_t m, int64_t k, const float *w, int64_t n, const float *bias,
                    const float *residual, float *y, int threads) {
    const int64_t tiles = n / 16, group = m == 1 ? 1 : 2;  /* tiles a task reads together */
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t task = 0; task < (tiles + group - 1) / group; task++) {
        const int64_t t0 = group * task;
        const int two = group == 2 && t0 + 1 < tiles;
        for (int64_t r = 0; r < m; r += F32_ROWS) {
            const int t = m - r < F32_ROWS ? (int)(m - r) : F32_ROWS;
            float sums[2][F32_ROWS][LANES];
            f32_sums(x + r * k, k, w + t0 * 16 * k, two, t, sums);
            for (int h = 0; h <= two; h++)
                for (int i = 0; i < t; i++)
                    for (int l = 0; l < LANES; l++) {
                        const int64_t o = 16 * (t0 + h) + l;
                        float v = sums[h][i][l];
                        if (bias) v = v + bias[o];
                        if (residual) v = residual[(r + i) * n + o] + v;
                        y[(r + i) * n + o] = v;
                    }
        }
    }
}
