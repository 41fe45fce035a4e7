/* Causal attention for narrow heads (width <= 8) on one CPU thread: lengthgen/accel/narrow_attention.py.

   SDPA's CPU flash kernel works on one (row, head) pair at a time with blocks built for wide
   heads; at 16 heads of width 4 it spends its time on bookkeeping, not arithmetic. Here each
   batch row is first copied to a (token, d, head) layout, so every inner loop runs over the heads
   of one (token, d) with unit stride: the heads are the SIMD lanes. The softmax is exact (no
   online rescaling): a query's scores over its keys fit in a (T, H) buffer.

   Tensors are addressed by strides, x[b, h, t, d] at x + b*s[0] + h*s[1] + t*s[2] + d*s[3], so
   q, k and v may be views of a fused qkv projection. The output o and the gradient of the
   output go are (B, T, H, D) contiguous; lse, the log-sum-exp of each query's scaled scores, is
   (B, T, H). The backward pass recomputes the probabilities from lse, as flash attention does. */
#include <math.h>
#include <stdlib.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* row b of x, (H, T, D) by strides -> y (T, D, H) */
ALWAYS_INLINE void to_heads_last(const float *x, const long *s, int T, int H, int D, float *y) {
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++)
            for (int h = 0; h < H; h++) y[((long)t * D + d) * H + h] = x[h * s[1] + t * s[2] + d * s[3]];
}

ALWAYS_INLINE void from_heads_last(const float *y, int T, int H, int D, float *x, const long *s) {
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++)
            for (int h = 0; h < H; h++) x[h * s[1] + t * s[2] + d * s[3]] = y[((long)t * D + d) * H + h];
}

ALWAYS_INLINE int forward_core(const float *q, const long *qs, const float *k, const long *ks,
                               const float *v, const long *vs, float *o, float *lse,
                               int B, int T, int H, int D, float scale) {
    const long C = (long)H * D, n = (long)T * C;
    const long o_strides[4] = {n, D, C, 1};  /* o as (B, H, T, D) strides of a (B, T, H, D) array */
    float *Q = malloc(sizeof(float) * (4 * n + (long)T * H));
    if (!Q) return 1;
    float *restrict K = Q + n, *restrict V = K + n, *restrict O = V + n, *restrict S = O + n;
    float m[H], l[H];
    for (int b = 0; b < B; b++) {
        to_heads_last(q + b * qs[0], qs, T, H, D, Q);
        to_heads_last(k + b * ks[0], ks, T, H, D, K);
        to_heads_last(v + b * vs[0], vs, T, H, D, V);
        for (int i = 0; i < T; i++) {
            const float *Qi = Q + i * C;
            float *Oi = O + i * C;
            for (int j = 0; j <= i; j++) {  /* scaled scores of query i against keys 0..i */
                const float *Kj = K + j * C;
                float *Sj = S + (long)j * H;
                for (int h = 0; h < H; h++) Sj[h] = 0.f;
                for (int d = 0; d < D; d++)
                    for (int h = 0; h < H; h++) Sj[h] += Qi[d * H + h] * Kj[d * H + h];
                for (int h = 0; h < H; h++) Sj[h] *= scale;
            }
            for (int h = 0; h < H; h++) { m[h] = S[h]; l[h] = 0.f; }
            for (int j = 1; j <= i; j++)
                for (int h = 0; h < H; h++) m[h] = fmaxf(m[h], S[(long)j * H + h]);
            for (long c = 0; c < C; c++) Oi[c] = 0.f;
            for (int j = 0; j <= i; j++) {
                float *Sj = S + (long)j * H;
                const float *Vj = V + j * C;
                for (int h = 0; h < H; h++) { Sj[h] = expf(Sj[h] - m[h]); l[h] += Sj[h]; }
                for (int d = 0; d < D; d++)
                    for (int h = 0; h < H; h++) Oi[d * H + h] += Sj[h] * Vj[d * H + h];
            }
            float *lse_i = lse + ((long)b * T + i) * H;
            for (int h = 0; h < H; h++) { lse_i[h] = m[h] + logf(l[h]); l[h] = 1.f / l[h]; }
            for (int d = 0; d < D; d++)
                for (int h = 0; h < H; h++) Oi[d * H + h] *= l[h];
        }
        from_heads_last(O, T, H, D, o + b * n, o_strides);
    }
    free(Q);
    return 0;
}

ALWAYS_INLINE int backward_core(const float *q, const long *qs, const float *k, const long *ks,
                                const float *v, const long *vs, const float *o, const float *go,
                                const float *lse, float *dq, float *dk, float *dv,
                                int B, int T, int H, int D, float scale) {
    const long C = (long)H * D, n = (long)T * C;
    const long o_strides[4] = {n, D, C, 1};
    float *Q = malloc(sizeof(float) * (8 * n + (long)T * H));
    if (!Q) return 1;
    float *restrict K = Q + n, *restrict V = K + n, *restrict G = V + n, *restrict O = G + n;
    float *restrict dQ = O + n, *restrict dK = dQ + n, *restrict dV = dK + n, *restrict delta = dV + n;
    float p[H], dp[H], ds[H];
    for (int b = 0; b < B; b++) {
        to_heads_last(q + b * qs[0], qs, T, H, D, Q);
        to_heads_last(k + b * ks[0], ks, T, H, D, K);
        to_heads_last(v + b * vs[0], vs, T, H, D, V);
        to_heads_last(go + b * n, o_strides, T, H, D, G);
        to_heads_last(o + b * n, o_strides, T, H, D, O);
        for (long c = 0; c < 3 * n; c++) dQ[c] = 0.f;  /* dQ, dK, dV */
        for (int i = 0; i < T; i++) {  /* delta_i = go_i . o_i, per head */
            float *di = delta + (long)i * H;
            for (int h = 0; h < H; h++) di[h] = 0.f;
            for (int d = 0; d < D; d++)
                for (int h = 0; h < H; h++) di[h] += G[i * C + d * H + h] * O[i * C + d * H + h];
        }
        for (int i = 0; i < T; i++) {
            const float *Qi = Q + i * C, *Gi = G + i * C, *di = delta + (long)i * H;
            const float *lse_i = lse + ((long)b * T + i) * H;
            float *dQi = dQ + i * C;
            for (int j = 0; j <= i; j++) {
                const float *Kj = K + j * C, *Vj = V + j * C;
                float *dKj = dK + j * C, *dVj = dV + j * C;
                for (int h = 0; h < H; h++) { p[h] = 0.f; dp[h] = 0.f; }
                for (int d = 0; d < D; d++)
                    for (int h = 0; h < H; h++) {
                        p[h] += Qi[d * H + h] * Kj[d * H + h];
                        dp[h] += Gi[d * H + h] * Vj[d * H + h];
                    }
                for (int h = 0; h < H; h++) {  /* p_ij, and the score's gradient p_ij (dp_ij - delta_i) */
                    p[h] = expf(p[h] * scale - lse_i[h]);
                    ds[h] = p[h] * (dp[h] - di[h]) * scale;
                }
                for (int d = 0; d < D; d++)
                    for (int h = 0; h < H; h++) {
                        dVj[d * H + h] += p[h] * Gi[d * H + h];
                        dQi[d * H + h] += ds[h] * Kj[d * H + h];
                        dKj[d * H + h] += ds[h] * Qi[d * H + h];
                    }
            }
        }
        from_heads_last(dQ, T, H, D, dq + b * n, o_strides);
        from_heads_last(dK, T, H, D, dk + b * n, o_strides);
        from_heads_last(dV, T, H, D, dv + b * n, o_strides);
    }
    free(Q);
    return 0;
}

/* Constant head counts and widths let the compiler unroll the head loops into whole vectors;
   other shapes run the same code with runtime bounds. */
#define SHAPES(call)                                                              \
    if (H == 16 && D == 4) return call(16, 4);                                    \
    if (H == 64 && D == 4) return call(64, 4);                                    \
    if (H == 8 && D == 8) return call(8, 8);                                      \
    if (H == 8 && D == 4) return call(8, 4);                                      \
    return call(H, D);

/* 0 on success, 1 if memory ran out */
int narrow_forward(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                   const long *vs, float *o, float *lse, int B, int T, int H, int D, float scale) {
#define FORWARD(h, d) forward_core(q, qs, k, ks, v, vs, o, lse, B, T, h, d, scale)
    SHAPES(FORWARD)
}

/* dq, dk, dv: (B, T, H, D) contiguous, like o */
int narrow_backward(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                    const long *vs, const float *o, const float *go, const float *lse,
                    float *dq, float *dk, float *dv, int B, int T, int H, int D, float scale) {
#define BACKWARD(h, d) backward_core(q, qs, k, ks, v, vs, o, go, lse, dq, dk, dv, B, T, h, d, scale)
    SHAPES(BACKWARD)
}
