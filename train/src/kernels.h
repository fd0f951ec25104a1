// Internal compute kernels of the model. Every kernel accumulates each output element in a fixed
// order that depends only on the shapes (see model.h "Determinism"); none of them threads.
#pragma once

#include <cstdint>

namespace zps::train::kernels {

/// C[M,N] = init + A[M,K] · B[K,N], where init is C itself (accumulate), else bias[N] (if not
/// null), else 0. Each C element sums k = 0..K-1 in ascending order.
void Gemm(const float* A, const float* B, const float* bias, float* C, int M, int K, int N,
          bool accumulate);

/// C[M,N] = A[M,K] · Bt[N,K]^T (B given transposed: the weight of a forward Gemm, for the
/// backward's input gradient). Each C element sums k = 0..K-1 in ascending order, so it has the
/// bits of Gemm over the transposed matrix.
void GemmTransB(const float* A, const float* Bt, float* C, int M, int K, int N);

/// dst[cols, rows] = src[rows, cols]^T.
void Transpose(const float* src, float* dst, int rows, int cols);

/// out = (x - mean) * rstd * g + b per row of length D; saves mean and rstd per row.
void LayerNormForward(const float* x, const float* g, const float* b, float* out, float* mean,
                      float* rstd, int N, int D);
/// dx = (overwrite) gradient w.r.t. x; dg, db accumulate (+=) over rows in row order.
void LayerNormBackward(const float* dout, const float* x, const float* mean, const float* rstd,
                       const float* g, float* dx, float* dg, float* db, int N, int D);

/// y = GELU_tanh(x), elementwise over n elements.
void GeluForward(const float* x, float* y, int64_t n);
/// dx = dy * GELU_tanh'(x).
void GeluBackward(const float* x, const float* dy, float* dx, int64_t n);

/// Causal multi-head attention over qkv[B*T, 3D] (q | k | v, head h at columns h*hd).
/// Writes probs[B, H, T, T] (row i holds j <= i; the rest is 0) and y[B*T, D].
void AttentionForward(const float* qkv, float* probs, float* y, int B, int T, int D, int H);
/// dqkv (overwrite) from dy[B*T, D].
void AttentionBackward(const float* qkv, const float* probs, const float* dy, float* dqkv, int B,
                       int T, int D, int H);

/// Mean cross-entropy of logits[N,V] against targets. Returns the loss (accumulated in double,
/// rows in order). If dlogits is not null, writes dlogits = (softmax - onehot) * grad_scale.
double CrossEntropy(const float* logits, const uint8_t* targets, float* dlogits, float grad_scale,
                    int N, int V);

/// out[j] (+)= sum over rows of x[row, j], rows in order.
void ColumnSum(const float* x, float* out, int N, int D, bool accumulate);

}  // namespace zps::train::kernels
