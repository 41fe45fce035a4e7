/* Causal attention for narrow heads (width <= 8) on CPU: lengthgen/accel/narrow_attention.py.

   SDPA's CPU flash kernel works on one (row, head) pair at a time with blocks built for wide
   heads; at 16 heads of width 4 it spends its time on bookkeeping, not arithmetic. Here each
   batch row is first copied to a (token, d, head) layout, so every inner loop runs over the heads
   of one (token, d) with unit stride: the heads are the SIMD lanes, W at a time, written with
   GCC/clang vector types (portable C: any CPU the compiler targets) so that no loop depends on
   the compiler's auto-vectoriser, which left the 16-head loops scalar. The head count is padded
   to a multiple of W with zero heads, whose results are dropped. exp is a vector polynomial
   (vexp, below), the softmax exact (no online rescaling): a query's scores over its keys fit in a
   (T, lanes) buffer.

   Tensors are addressed by strides, x[b, h, t, d] at x + b*s[0] + h*s[1] + t*s[2] + d*s[3], so
   q, k and v may be views of a fused qkv projection. The output o and the gradient of the
   output go are (B, T, H, D) contiguous; lse, the log-sum-exp of each query's scaled scores, is
   (B, T, H). The backward pass recomputes the probabilities from lse, as flash attention does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define W 8 /* lanes per vector: 32 bytes, one AVX register, two NEON ones */
typedef float vf __attribute__((vector_size(4 * W)));
typedef int vi __attribute__((vector_size(4 * W)));
#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE vf splat(float x) { return (vf){0} + x; }
ALWAYS_INLINE vf vmax(vf a, vf b) { vi m = a > b; return (vf)(((vi)a & m) | ((vi)b & ~m)); }

/* e^x for x <= 88, to about 2 ulp: Cephes' expf (x = n ln2 + r, |r| <= ln2 / 2, a degree-6
   polynomial in r, times 2^n); below -87 it returns e^-87 (1.6e-38), which no softmax term feels. */
ALWAYS_INLINE vf vexp(vf x) {
    x = vmax(x, splat(-87.0f));
    vf z = x * 1.44269504088896341f + 0.5f;
    vi n = __builtin_convertvector(z, vi);           /* truncates: floor for z >= 0 */
    n += (vi)(__builtin_convertvector(n, vf) > z);    /* -1 where truncation rounded up (z < 0) */
    vf f = __builtin_convertvector(n, vf);
    vf r = x - f * 0.693359375f + f * 2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (vf)((n + 127) << 23);
}

/* row b of x, (H, T, D) by strides -> y (T, D, L) with L >= H lanes, the extra heads zero */
ALWAYS_INLINE void to_heads_last(const float *x, const long *s, int T, int H, int L, int D, float *y) {
    memset(y, 0, sizeof(float) * T * D * L);
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++)
            for (int h = 0; h < H; h++) y[((long)t * D + d) * L + h] = x[h * s[1] + t * s[2] + d * s[3]];
}

ALWAYS_INLINE void from_heads_last(const float *y, int T, int H, int L, int D, float *x, const long *s) {
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++)
            for (int h = 0; h < H; h++) x[h * s[1] + t * s[2] + d * s[3]] = y[((long)t * D + d) * L + h];
}

/* n vectors, 64-byte aligned (vf loads need 32), or NULL */
static vf *vectors(long n) {
    return aligned_alloc(64, ((sizeof(vf) * n + 63) / 64) * 64);
}

ALWAYS_INLINE int forward_core(const float *q, const long *qs, const float *k, const long *ks,
                               const float *v, const long *vs, float *o, float *lse,
                               int B, int T, int H, int D, float scale) {
    const int G = (H + W - 1) / W, L = G * W;  /* vectors per (token, d); lanes */
    const long n = (long)T * D * G;            /* vectors per row of q */
    const long o_strides[4] = {(long)T * H * D, D, (long)H * D, 1};  /* (B, H, T, D) strides of (B, T, H, D) */
    vf *Q = vectors(4 * n + (long)T * G + 2 * G);
    if (!Q) return 1;
    vf *restrict K = Q + n, *restrict V = K + n, *restrict O = V + n, *restrict S = O + n;
    vf *restrict m = S + (long)T * G, *restrict l = m + G;
    for (int b = 0; b < B; b++) {
        to_heads_last(q + b * qs[0], qs, T, H, L, D, (float *)Q);
        to_heads_last(k + b * ks[0], ks, T, H, L, D, (float *)K);
        to_heads_last(v + b * vs[0], vs, T, H, L, D, (float *)V);
        for (int i = 0; i < T; i++) {
            const vf *Qi = Q + (long)i * D * G;
            vf *Oi = O + (long)i * D * G;
            for (int j = 0; j <= i; j++) {  /* scaled scores of query i against keys 0..i, and their max */
                const vf *Kj = K + (long)j * D * G;
                for (int g = 0; g < G; g++) {
                    vf s = {0};
                    for (int d = 0; d < D; d++) s += Qi[d * G + g] * Kj[d * G + g];
                    s *= scale;
                    S[(long)j * G + g] = s;
                    m[g] = j ? vmax(m[g], s) : s;
                }
            }
            for (int g = 0; g < G; g++) l[g] = splat(0.f);
            for (int c = 0; c < D * G; c++) Oi[c] = splat(0.f);
            for (int j = 0; j <= i; j++) {
                const vf *Vj = V + (long)j * D * G;
                for (int g = 0; g < G; g++) {
                    vf p = vexp(S[(long)j * G + g] - m[g]);
                    l[g] += p;
                    for (int d = 0; d < D; d++) Oi[d * G + g] += p * Vj[d * G + g];
                }
            }
            float *lse_i = lse + ((long)b * T + i) * H;
            for (int h = 0; h < H; h++) lse_i[h] = ((float *)m)[h] + logf(((float *)l)[h]);
            for (int g = 0; g < G; g++) {
                vf inv = 1.0f / l[g];
                for (int d = 0; d < D; d++) Oi[d * G + g] *= inv;
            }
        }
        from_heads_last((float *)O, T, H, L, D, o + b * o_strides[0], o_strides);
    }
    free(Q);
    return 0;
}

ALWAYS_INLINE int backward_core(const float *q, const long *qs, const float *k, const long *ks,
                                const float *v, const long *vs, const float *o, const float *go,
                                const float *lse, float *dq, float *dk, float *dv,
                                int B, int T, int H, int D, float scale) {
    const int G = (H + W - 1) / W, L = G * W;
    const long n = (long)T * D * G;
    const long o_strides[4] = {(long)T * H * D, D, (long)H * D, 1};
    vf *Q = vectors(8 * n + 2 * (long)T * G);
    if (!Q) return 1;
    vf *restrict K = Q + n, *restrict V = K + n, *restrict Gr = V + n, *restrict O = Gr + n;
    vf *restrict dQ = O + n, *restrict dK = dQ + n, *restrict dV = dK + n;
    vf *restrict delta = dV + n, *restrict Lse = delta + (long)T * G;  /* (T, G) each */
    for (int b = 0; b < B; b++) {
        to_heads_last(q + b * qs[0], qs, T, H, L, D, (float *)Q);
        to_heads_last(k + b * ks[0], ks, T, H, L, D, (float *)K);
        to_heads_last(v + b * vs[0], vs, T, H, L, D, (float *)V);
        to_heads_last(go + b * o_strides[0], o_strides, T, H, L, D, (float *)Gr);
        to_heads_last(o + b * o_strides[0], o_strides, T, H, L, D, (float *)O);
        memset(dQ, 0, sizeof(vf) * 3 * n);  /* dQ, dK, dV */
        memset(Lse, 0, sizeof(vf) * T * G);  /* the extra heads' lse is 0: their p is 1, their ds 0 */
        for (int i = 0; i < T; i++) {  /* delta_i = go_i . o_i, per head */
            memcpy((float *)(Lse + (long)i * G), lse + ((long)b * T + i) * H, sizeof(float) * H);
            for (int g = 0; g < G; g++) {
                vf acc = {0};
                for (int d = 0; d < D; d++) acc += Gr[((long)i * D + d) * G + g] * O[((long)i * D + d) * G + g];
                delta[(long)i * G + g] = acc;
            }
        }
        for (int i = 0; i < T; i++) {
            const vf *Qi = Q + (long)i * D * G, *Gi = Gr + (long)i * D * G;
            const vf *di = delta + (long)i * G, *lse_i = Lse + (long)i * G;
            vf *dQi = dQ + (long)i * D * G;
            for (int j = 0; j <= i; j++) {
                const vf *Kj = K + (long)j * D * G, *Vj = V + (long)j * D * G;
                vf *dKj = dK + (long)j * D * G, *dVj = dV + (long)j * D * G;
                for (int g = 0; g < G; g++) {
                    vf s = {0}, dp = {0};
                    for (int d = 0; d < D; d++) {
                        s += Qi[d * G + g] * Kj[d * G + g];
                        dp += Gi[d * G + g] * Vj[d * G + g];
                    }
                    /* p_ij, and the score's gradient p_ij (dp_ij - delta_i) */
                    vf p = vexp(s * scale - lse_i[g]);
                    vf ds = p * (dp - di[g]) * scale;
                    for (int d = 0; d < D; d++) {
                        dVj[d * G + g] += p * Gi[d * G + g];
                        dQi[d * G + g] += ds * Kj[d * G + g];
                        dKj[d * G + g] += ds * Qi[d * G + g];
                    }
                }
            }
        }
        from_heads_last((float *)dQ, T, H, L, D, dq + b * o_strides[0], o_strides);
        from_heads_last((float *)dK, T, H, L, D, dk + b * o_strides[0], o_strides);
        from_heads_last((float *)dV, T, H, L, D, dv + b * o_strides[0], o_strides);
    }
    free(Q);
    return 0;
}

/* Constant head widths and vector counts let the compiler unroll the d and g loops and keep a
   query's accumulators in registers; other shapes run the same code with runtime bounds. */
#define SHAPES(call)                                                              \
    if (H == 16 && D == 4) return call(16, 4);                                    \
    if (H == 64 && D == 4) return call(64, 4);                                    \
    if (H == 8 && D == 8) return call(8, 8);                                      \
    if (H == 8 && D == 4) return call(8, 4);                                      \
    return call(H, D);

static int forward_rows(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                        const long *vs, float *o, float *lse, int B, int T, int H, int D, float scale) {
#define FORWARD(h, d) forward_core(q, qs, k, ks, v, vs, o, lse, B, T, h, d, scale)
    SHAPES(FORWARD)
}

static int backward_rows(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                         const long *vs, const float *o, const float *go, const float *lse,
                         float *dq, float *dk, float *dv, int B, int T, int H, int D, float scale) {
#define BACKWARD(h, d) backward_core(q, qs, k, ks, v, vs, o, go, lse, dq, dk, dv, B, T, h, d, scale)
    SHAPES(BACKWARD)
}

/* The batch in `threads` slices of rows, each slice on a thread of OpenMP's where the library is
   built with it (lengthgen links torch's own runtime, whose threads have just run torch's
   operators and wait for the next; threads of another pool would contend with them for the
   cores), else one slice after another. A row's arithmetic is the same in any slice. */
#define SLICE(s) const int b0 = (int)((long)B * (s) / threads), rows = (int)((long)B * ((s) + 1) / threads) - b0; \
                 const long row = (long)T * H * D /* a row of o, go, dq, dk, dv */

/* 0 on success, 1 if memory ran out */
int narrow_forward(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                   const long *vs, float *o, float *lse, int B, int T, int H, int D, float scale, int threads) {
    int failed = 0;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static, 1) reduction(| : failed)
    for (int s = 0; s < threads; s++) {
        SLICE(s);
        failed |= forward_rows(q + b0 * qs[0], qs, k + b0 * ks[0], ks, v + b0 * vs[0], vs, o + b0 * row,
                               lse + (long)b0 * T * H, rows, T, H, D, scale);
    }
    return failed;
}

/* dq, dk, dv: (B, T, H, D) contiguous, like o */
int narrow_backward(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                    const long *vs, const float *o, const float *go, const float *lse,
                    float *dq, float *dk, float *dv, int B, int T, int H, int D, float scale, int threads) {
    int failed = 0;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static, 1) reduction(| : failed)
    for (int s = 0; s < threads; s++) {
        SLICE(s);
        failed |= backward_rows(q + b0 * qs[0], qs, k + b0 * ks[0], ks, v + b0 * vs[0], vs, o + b0 * row,
                                go + b0 * row, lse + (long)b0 * T * H, dq + b0 * row, dk + b0 * row, dv + b0 * row,
                                rows, T, H, D, scale);
    }
    return failed;
}
