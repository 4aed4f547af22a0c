// voxpool OpenCL kernels: one program, built once per context.
//
// Activations are float32. Copy-like kernels (block copy, strided copy, pad,
// gather) are generated per element size (4 and 8 bytes) and move bits, so they
// also serve int32/int64 arrays. Indices are 32-bit: the host refuses arrays of
// 2^31 elements or more.
//
// FP_CONTRACT OFF keeps a*b+c as two roundings, as numpy computes it, so the
// elementwise kernels (GELU, sigmoid, layer norm) agree with the reference to a
// few ulp. The GEMM/conv/LSTM products switch it ON in their bodies: fused
// multiply-adds (BLAS uses them too). Not mad()/fma(): PoCL lowers those to library
// calls about 8x slower than a contracted a*b+c.
#pragma OPENCL FP_CONTRACT OFF

// ---------------------------------------------------------------- elementwise

// erf as numpy_backend._erf computes it (the Eigen/XLA float32 rational form).
inline float vox_erf(float x) {
    x = clamp(x, -4.0f, 4.0f);
    const float x2 = x * x;
    float p = x2 * -2.72614225801306e-10f;
    p += 2.77068142495902e-08f;  p *= x2;
    p += -2.10102402082508e-06f; p *= x2;
    p += -5.69250639462346e-05f; p *= x2;
    p += -7.34990630326855e-04f; p *= x2;
    p += -2.95459980854025e-03f; p *= x2;
    p += -1.60960333262415e-02f;
    float q = x2 * -1.45660718464996e-05f;
    q += -2.13374055278905e-04f; q *= x2;
    q += -1.68282697438203e-03f; q *= x2;
    q += -7.37332916720468e-03f; q *= x2;
    q += -1.42647390514189e-02f;
    p *= x;
    return p / q;
}

// op: 0 scale(p), 1 exp, 2 sqrt, 3 tanh, 4 sigmoid, 5 relu, 6 leaky_relu(p), 7 gelu
__kernel void unary_f(__global float* out, __global const float* x, const int op, const float p,
                      const int n_items) {
    const int i = get_global_id(0);
    if (i >= n_items) return;
    const float v = x[i];
    float r;
    switch (op) {
        case 0: r = v * p; break;
        case 1: r = exp(v); break;
        case 2: r = sqrt(v); break;
        case 3: r = tanh(v); break;
        case 4: r = 0.5f * (1.0f + tanh(0.5f * v)); break;
        case 5: r = v > 0.0f ? v : (isnan(v) ? v : 0.0f); break;
        case 6: r = v >= 0.0f ? v : v * p; break;
        default: r = 0.5f * v * (1.0f + vox_erf(v / 1.41421353816986083984375f)); break;
    }
    out[i] = r;
}

inline float vox_binary(const int op, const float a, const float b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        default: return a / b;
    }
}

// Same-shape operands.
__kernel void binary_flat(__global float* out, __global const float* a, __global const float* b,
                          const int op, const int n_items) {
    const int i = get_global_id(0);
    if (i >= n_items) return;
    out[i] = vox_binary(op, a[i], b[i]);
}

// Broadcasting over two (collapsed) dims [d0, d1], the common bias / row cases, as a
// 2-D launch (d1 items, d0 rows): no integer division per element.
__kernel void binary_2d(__global float* out, __global const float* a, __global const float* b,
                        const int op, const int sa0, const int sa1, const int sb0,
                        const int sb1, const int d1) {
    const int i1 = get_global_id(0);
    if (i1 >= d1) return;
    const int i0 = get_global_id(1);
    out[i0 * d1 + i1] = vox_binary(op, a[i0 * sa0 + i1 * sa1], b[i0 * sb0 + i1 * sb1]);
}

// Broadcasting: out is contiguous with (collapsed) shape [d0..d5]; sa*/sb* are the
// operands' element strides per output dim (0 where broadcast); o_* are base offsets
// (the host loops over any leading dims beyond six).
__kernel void binary_nd(__global float* out, __global const float* a, __global const float* b,
                        const int op, const int d1, const int d2, const int d3, const int d4,
                        const int d5, const int sa0, const int sa1, const int sa2, const int sa3,
                        const int sa4, const int sa5, const int sb0, const int sb1, const int sb2,
                        const int sb3, const int sb4, const int sb5, const int o_out,
                        const int o_a, const int o_b, const int n_items) {
    const int i = get_global_id(0);
    if (i >= n_items) return;
    int r = i;
    const int i5 = r % d5; r /= d5;
    const int i4 = r % d4; r /= d4;
    const int i3 = r % d3; r /= d3;
    const int i2 = r % d2; r /= d2;
    const int i1 = r % d1;
    const int i0 = r / d1;
    const int ia = o_a + i0 * sa0 + i1 * sa1 + i2 * sa2 + i3 * sa3 + i4 * sa4 + i5 * sa5;
    const int ib = o_b + i0 * sb0 + i1 * sb1 + i2 * sb2 + i3 * sb3 + i4 * sb4 + i5 * sb5;
    out[o_out + i] = vox_binary(op, a[ia], b[ib]);
}

// ---------------------------------------------------------------- copies (bit movers)

#define COPY_KERNELS(T, S)                                                                      \
/* dst[o * dst_row + dst_off + i] = src[o * src_row + src_off + i]; global (len, outer) */      \
__kernel void copy_block_##S(__global T* dst, __global const T* src, const int dst_row,         \
                             const int dst_off, const int src_row, const int src_off,           \
                             const int n_items) {                                               \
    const int i = get_global_id(0);                                                             \
    if (i >= n_items) return;                                                                   \
    const int o = get_global_id(1);                                                             \
    dst[o * dst_row + dst_off + i] = src[o * src_row + src_off + i];                            \
}                                                                                               \
/* contiguous out of (collapsed) shape [d0..d5] from src with element strides s0..s5 */         \
__kernel void copy_nd_##S(__global T* out, __global const T* src, const int d1, const int d2,   \
                          const int d3, const int d4, const int d5, const int s0,               \
                          const int s1, const int s2, const int s3, const int s4,               \
                          const int s5, const int o_out, const int o_src, const int n_items) {  \
    const int i = get_global_id(0);                                                             \
    if (i >= n_items) return;                                                                   \
    int r = i;                                                                                  \
    const int i5 = r % d5; r /= d5;                                                             \
    const int i4 = r % d4; r /= d4;                                                             \
    const int i3 = r % d3; r /= d3;                                                             \
    const int i2 = r % d2; r /= d2;                                                             \
    const int i1 = r % d1;                                                                      \
    const int i0 = r / d1;                                                                      \
    out[o_out + i] = src[o_src + i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3 + i4 * s4 + i5 * s5];    \
}                                                                                               \
/* out [outer, n_out, inner] from x [outer, n_in, inner] padded along the middle axis.          \
   mode: 0 constant (zero bits), 1 reflect, 2 edge, 3 symmetric */                              \
__kernel void pad_##S(__global T* out, __global const T* x, const int n_in, const int n_out,    \
                      const int inner, const int before, const int mode, const int n_items) {   \
    const int i = get_global_id(0);                                                             \
    if (i >= n_items) return;                                                                   \
    const int c = i % inner;                                                                    \
    const int j = (i / inner) % n_out;                                                          \
    const int o = i / (inner * n_out);                                                          \
    int s = j - before;                                                                         \
    if (s < 0 || s >= n_in) {                                                                   \
        if (mode == 0) { out[i] = (T)0; return; }                                               \
        if (mode == 2) { s = s < 0 ? 0 : n_in - 1; }                                            \
        else if (mode == 1) {                                                                   \
            if (n_in == 1) { s = 0; } else {                                                    \
                const int period = 2 * (n_in - 1);                                              \
                int m = s % period; if (m < 0) m += period;                                     \
                s = m < n_in ? m : period - m;                                                  \
            }                                                                                   \
        } else {                                                                                \
            const int period = 2 * n_in;                                                        \
            int m = s % period; if (m < 0) m += period;                                         \
            s = m < n_in ? m : period - 1 - m;                                                  \
        }                                                                                       \
    }                                                                                           \
    out[i] = x[(o * n_in + s) * inner + c];                                                     \
}                                                                                               \
/* out [outer, n_idx, inner] = x[outer, idx[j], inner] */                                       \
__kernel void take_##S(__global T* out, __global const T* x, __global const int* idx,           \
                       const int n_in, const int n_idx, const int inner, const int n_items) {   \
    const int i = get_global_id(0);                                                             \
    if (i >= n_items) return;                                                                   \
    const int c = i % inner;                                                                    \
    const int j = (i / inner) % n_idx;                                                          \
    const int o = i / (inner * n_idx);                                                          \
    out[i] = x[(o * n_in + idx[j]) * inner + c];                                                \
}

COPY_KERNELS(uint, 4)
COPY_KERNELS(ulong, 8)

// ---------------------------------------------------------------- reductions

#define RL 64  // work-group size of the row kernels (a power of two)

// Compensated (Kahan) accumulation for the one-item-per-row kernels: a long row summed
// in order would lose ~sqrt(n) ulp; this keeps it near numpy's pairwise sums.
#define KAHAN_ADD(sum, comp, v) { const float y_ = (v) - comp; const float t_ = sum + y_; \
                                  comp = (t_ - sum) - y_; sum = t_; }

inline float vox_max(const float a, const float b) {
    return (b > a || isnan(b)) ? b : a;
}

// Work-group reduction of one value per work item (op 0 sum, 1 max); all items get it.
inline float wg_reduce(__local float* buf, const float v, const int op) {
    const int l = get_local_id(0);
    buf[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = RL / 2; s > 0; s >>= 1) {
        if (l < s) buf[l] = op == 0 ? buf[l] + buf[l + s] : vox_max(buf[l], buf[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// One work group per row of n contiguous values: out[row] = sum / max.
__kernel __attribute__((reqd_work_group_size(RL, 1, 1)))
void reduce_rows(__global float* out, __global const float* x, const int n, const int op) {
    __local float buf[RL];
    const int row = get_group_id(0);
    const int l = get_local_id(0);
    __global const float* xr = x + row * n;
    float acc = op == 0 ? 0.0f : -INFINITY;
    for (int i = l; i < n; i += RL) acc = op == 0 ? acc + xr[i] : vox_max(acc, xr[i]);
    acc = wg_reduce(buf, acc, op);
    if (l == 0) out[row] = acc;
}

// One work item per (outer, inner) output of x [outer, n, inner].
__kernel void reduce_strided(__global float* out, __global const float* x, const int n,
                             const int inner, const int op, const int n_items) {
    const int i = get_global_id(0);
    if (i >= n_items) return;
    const int c = i % inner;
    __global const float* xr = x + (i / inner) * n * inner + c;
    float acc = op == 0 ? 0.0f : -INFINITY;
    float comp = 0.0f;
    if (op == 0) {
        for (int j = 0; j < n; ++j) KAHAN_ADD(acc, comp, xr[j * inner]);
    } else {
        for (int j = 0; j < n; ++j) acc = vox_max(acc, xr[j * inner]);
    }
    out[i] = acc;
}

// softmax (logp 0) / log_softmax (logp 1) over rows of n contiguous values.
__kernel __attribute__((reqd_work_group_size(RL, 1, 1)))
void softmax_rows(__global float* out, __global const float* x, const int n, const int logp) {
    __local float buf[RL];
    const int row = get_group_id(0);
    const int l = get_local_id(0);
    __global const float* xr = x + row * n;
    __global float* yr = out + row * n;
    float m = -INFINITY;
    for (int i = l; i < n; i += RL) m = vox_max(m, xr[i]);
    m = wg_reduce(buf, m, 1);
    float s = 0.0f;
    for (int i = l; i < n; i += RL) {
        const float e = exp(xr[i] - m);
        if (!logp) yr[i] = e;  // one exp per element, as numpy
        s += e;
    }
    s = wg_reduce(buf, s, 0);
    if (logp) {
        const float ls = log(s);
        for (int i = l; i < n; i += RL) yr[i] = (xr[i] - m) - ls;
    } else {
        for (int i = l; i < n; i += RL) yr[i] = yr[i] / s;
    }
}

// The same over axis 1 of x [outer, n, inner], one work item per (outer, inner).
__kernel void softmax_strided(__global float* out, __global const float* x, const int n,
                              const int inner, const int logp, const int n_items) {
    const int i = get_global_id(0);
    if (i >= n_items) return;
    const int c = i % inner;
    const int base = (i / inner) * n * inner + c;
    float m = -INFINITY;
    for (int j = 0; j < n; ++j) m = vox_max(m, x[base + j * inner]);
    float s = 0.0f, comp = 0.0f;
    for (int j = 0; j < n; ++j) {
        const float e = exp(x[base + j * inner] - m);
        if (!logp) out[base + j * inner] = e;
        KAHAN_ADD(s, comp, e);
    }
    if (logp) {
        const float ls = log(s);
        for (int j = 0; j < n; ++j) out[base + j * inner] = (x[base + j * inner] - m) - ls;
    } else {
        for (int j = 0; j < n; ++j) out[base + j * inner] = out[base + j * inner] / s;
    }
}

// softmax / log_softmax with one work item per contiguous row, eight lanes at a time
// (CPU devices: the rows kernel's barriers are slow under PoCL, and lanes along the
// row vectorise where work items across rows would need gathers).
__kernel void softmax_vec(__global float* out, __global const float* x, const int n,
                          const int logp, const int n_items) {
    const int row = get_global_id(0);
    if (row >= n_items) return;
    __global const float* xr = x + row * n;
    __global float* yr = out + row * n;
    float8 m8 = (float8)(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const float8 v = vload8(0, xr + i);
        m8 = select(m8, v, isgreater(v, m8) | isnan(v));
    }
    float m = -INFINITY;
    for (int l = 0; l < 8; ++l) m = vox_max(m, ((float*)&m8)[l]);
    for (; i < n; ++i) m = vox_max(m, xr[i]);
    float8 s8 = (float8)(0.0f), c8 = (float8)(0.0f);  // lane-wise Kahan sums
    for (i = 0; i + 8 <= n; i += 8) {
        const float8 e = exp(vload8(0, xr + i) - m);
        if (!logp) vstore8(e, 0, yr + i);
        const float8 y = e - c8;
        const float8 t = s8 + y;
        c8 = (t - s8) - y;
        s8 = t;
    }
    float s = 0.0f, comp = 0.0f;
    for (int l = 0; l < 8; ++l) KAHAN_ADD(s, comp, ((float*)&s8)[l]);
    for (; i < n; ++i) {
        const float e = exp(xr[i] - m);
        if (!logp) yr[i] = e;
        KAHAN_ADD(s, comp, e);
    }
    if (logp) {
        const float ls = log(s);
        for (i = 0; i < n; ++i) yr[i] = (xr[i] - m) - ls;
    } else {
        for (i = 0; i < n; ++i) yr[i] = yr[i] / s;
    }
}

// Layer norm over rows of n values; flags bit 0: gamma, bit 1: beta. As numpy:
// centered / sqrt(mean(centered^2) + eps) * gamma + beta.
__kernel __attribute__((reqd_work_group_size(RL, 1, 1)))
void layer_norm_rows(__global float* out, __global const float* x, __global const float* gamma,
                     __global const float* beta, const int n, const float eps, const int flags) {
    __local float buf[RL];
    const int row = get_group_id(0);
    const int l = get_local_id(0);
    __global const float* xr = x + row * n;
    __global float* yr = out + row * n;
    float s = 0.0f;
    for (int i = l; i < n; i += RL) s += xr[i];
    const float mean = wg_reduce(buf, s, 0) / (float)n;
    float v = 0.0f;
    for (int i = l; i < n; i += RL) { const float d = xr[i] - mean; v += d * d; }
    const float den = sqrt(wg_reduce(buf, v, 0) / (float)n + eps);
    for (int i = l; i < n; i += RL) {
        float y = (xr[i] - mean) / den;
        if (flags & 1) y = y * gamma[i];
        if (flags & 2) y = y + beta[i];
        yr[i] = y;
    }
}

// The same with one work item per row (short rows).
__kernel void layer_norm_item(__global float* out, __global const float* x,
                              __global const float* gamma, __global const float* beta,
                              const int n, const float eps, const int flags, const int n_items) {
    const int row = get_global_id(0);
    if (row >= n_items) return;
    __global const float* xr = x + row * n;
    __global float* yr = out + row * n;
    float s = 0.0f, comp = 0.0f;
    for (int i = 0; i < n; ++i) KAHAN_ADD(s, comp, xr[i]);
    const float mean = s / (float)n;
    float v = 0.0f;
    comp = 0.0f;
    for (int i = 0; i < n; ++i) { const float d = xr[i] - mean; KAHAN_ADD(v, comp, d * d); }
    const float den = sqrt(v / (float)n + eps);
    for (int i = 0; i < n; ++i) {
        float y = (xr[i] - mean) / den;
        if (flags & 1) y = y * gamma[i];
        if (flags & 2) y = y + beta[i];
        yr[i] = y;
    }
}

// ---------------------------------------------------------------- GEMM / conv

// Tiled GEMM: each 8x8 work group computes a 32x32 tile of C, each work item a 4x4
// register block; A and B tiles of depth 16 are staged in local memory.
//
// Batch bz (global dim 2): A += (bz % a_mod) * a_stride, B += (bz % b_mod) * b_stride,
// C += bz * M * N, so a weight shared by every batch has a_mod 1 / a_stride 0, and a
// grouped conv's weight (bz = batch * groups + g) has a_mod = groups.
// B is [K, N] (ldb), or [N, K] when trans_b. When conv_k > 0, B is the implicit
// im2col matrix of x [Cin_g, conv_tin] (the batch's group slice):
//   B[ci * conv_k + kk, t] = x[ci, t * conv_stride + kk * conv_dil - conv_pad] (0 outside).
// C = alpha * A B, plus bias[col] (bias_mode 1) or bias[(bz % a_mod) * M + row] (mode 2).
#define TM 32
#define TN 32
#define TK 16
#define WM 4
#define WN 4

__kernel __attribute__((reqd_work_group_size(8, 8, 1)))
void gemm(__global float* C, __global const float* A, __global const float* B,
          __global const float* bias, const int M, const int N, const int K, const int lda,
          const int ldb, const int trans_b, const int a_mod, const int a_stride,
          const int b_mod, const int b_stride, const float alpha, const int bias_mode,
          const int conv_tin, const int conv_k, const int conv_stride, const int conv_dil,
          const int conv_pad) {
#pragma OPENCL FP_CONTRACT ON  // a*b+c as one fused multiply-add (mad()/fma() are slow calls on PoCL)
    __local float As[TK][TM];
    __local float Bs[TK][TN];
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int lid = ty * 8 + tx;
    const int bz = get_global_id(2);
    const int row0 = get_group_id(1) * TM;
    const int col0 = get_group_id(0) * TN;
    A += (bz % a_mod) * a_stride;
    B += (bz % b_mod) * b_stride;
    C += bz * M * N;
    float acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int e = lid; e < TM * TK; e += 64) {
            const int m = e / TK, k = e % TK;
            const int gm = row0 + m, gk = k0 + k;
            As[k][m] = (gm < M && gk < K) ? A[gm * lda + gk] : 0.0f;
        }
        for (int e = lid; e < TK * TN; e += 64) {
            int k, n;
            if (trans_b) { n = e / TK; k = e % TK; } else { k = e / TN; n = e % TN; }
            const int gk = k0 + k, gn = col0 + n;
            float v = 0.0f;
            if (gk < K && gn < N) {
                if (conv_k > 0) {
                    const int ci = gk / conv_k;
                    const int kk = gk - ci * conv_k;
                    const int src = gn * conv_stride + kk * conv_dil - conv_pad;
                    if (src >= 0 && src < conv_tin) v = B[ci * conv_tin + src];
                } else {
                    v = trans_b ? B[gn * ldb + gk] : B[gk * ldb + gn];
                }
            }
            Bs[k][n] = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TK; ++k) {
            float a[WM], b[WN];
            for (int i = 0; i < WM; ++i) a[i] = As[k][ty + 8 * i];
            for (int j = 0; j < WN; ++j) b[j] = Bs[k][tx + 8 * j];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j) acc[i][j] += a[i] * b[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < WM; ++i) {
        const int gm = row0 + ty + 8 * i;
        if (gm >= M) continue;
        for (int j = 0; j < WN; ++j) {
            const int gn = col0 + tx + 8 * j;
            if (gn >= N) continue;
            float v = acc[i][j] * alpha;
            if (bias_mode == 1) v = v + bias[gn];
            else if (bias_mode == 2) v = v + bias[(bz % a_mod) * M + gm];
            C[gm * N + gn] = v;
        }
    }
}

// Transposed conv1d, second half: overlap-add of the GEMM's per-tap products.
// contrib [B, Cout, K, Tin] holds w[ci, co, kk] . x[b, ci, s] summed over the group's
// input channels; out [B, Cout, Tout] sums, for each t, the taps kk that land on it
// (t + pad - kk * dil = s * stride), plus the bias.
__kernel void overlap_add(__global float* out, __global const float* contrib,
                          __global const float* bias, const int has_bias, const int cout,
                          const int tin, const int tout, const int k, const int stride,
                          const int pad, const int dil, const int n_items) {
    const int i = get_global_id(0);
    if (i >= n_items) return;
    const int t = i % tout;
    const int bc = i / tout;  // b * cout + co
    __global const float* cr = contrib + bc * k * tin;
    float acc = 0.0f;
    for (int kk = 0; kk < k; ++kk) {
        const int num = t + pad - kk * dil;
        if (num < 0 || num % stride != 0) continue;
        const int s = num / stride;
        if (s < tin) acc += cr[kk * tin + s];
    }
    out[i] = has_bias ? acc + bias[bc % cout] : acc;
}

// ---------------------------------------------------------------- LSTM

// One LSTM step (torch gate order i, f, g, o) for every (j < H, b) in global (>= H, B):
// z = h_in[b] . w_hh[q*H + j] + gx[b, q*H + j]; sigmoid as 0.5 * tanh(z / 2) + 0.5
// (as numpy_backend); c is updated in place; h_out must not alias h_in.
__kernel void lstm_step(__global float* h_out, __global float* c, __global const float* h_in,
                        __global const float* gx, __global const float* w_hh, const int H,
                        const int h_in_off, const int h_out_off, const int gx_off) {
#pragma OPENCL FP_CONTRACT ON  // a*b+c as one fused multiply-add (mad()/fma() are slow calls on PoCL)
    const int j = get_global_id(0);
    const int b = get_global_id(1);
    if (j >= H) return;
    __global const float* hr = h_in + h_in_off + b * H;
    __global const float* g = gx + gx_off + b * 4 * H;
    float z[4];
    for (int q = 0; q < 4; ++q) {
        __global const float* wr = w_hh + (q * H + j) * H;
        float8 acc8 = (float8)(0.0f);
        int k = 0;
        for (; k + 8 <= H; k += 8) acc8 += vload8(0, hr + k) * vload8(0, wr + k);
        const float4 h4 = acc8.lo + acc8.hi;
        const float2 h2 = h4.lo + h4.hi;
        float acc = h2.lo + h2.hi;
        for (; k < H; ++k) acc += hr[k] * wr[k];
        z[q] = acc + g[q * H + j];
    }
    const float ig = tanh(z[0] * 0.5f) * 0.5f + 0.5f;
    const float fg = tanh(z[1] * 0.5f) * 0.5f + 0.5f;
    const float gg = tanh(z[2]);
    const float og = tanh(z[3] * 0.5f) * 0.5f + 0.5f;
    const int ci = b * H + j;
    const float cn = fg * c[ci] + ig * gg;
    c[ci] = cn;
    h_out[h_out_off + ci] = og * tanh(cn);
}

// Matrix-vector form for CPU devices (M < 4 with B transposed: decoder steps): one
// output per work item, a contiguous dot product over K. Arguments and batch mapping
// as gemm; global (>= N, M, batch).
__kernel void gemm_direct(__global float* C, __global const float* A, __global const float* B,
                          __global const float* bias, const int M, const int N, const int K,
                          const int lda, const int ldb, const int trans_b, const int a_mod,
                          const int a_stride, const int b_mod, const int b_stride,
                          const float alpha, const int bias_mode, const int conv_tin,
                          const int conv_k, const int conv_stride, const int conv_dil,
                          const int conv_pad) {
#pragma OPENCL FP_CONTRACT ON  // a*b+c as one fused multiply-add (mad()/fma() are slow calls on PoCL)
    const int gn = get_global_id(0);
    const int gm = get_global_id(1);
    const int bz = get_global_id(2);
    if (gn >= N || gm >= M) return;
    A += (bz % a_mod) * a_stride + gm * lda;
    B += (bz % b_mod) * b_stride;
    C += bz * M * N;
    float acc = 0.0f;
    if (conv_k > 0) {
        const int t0 = gn * conv_stride - conv_pad;
        for (int ci = 0, r = 0; ci < K / conv_k; ++ci) {
            __global const float* xr = B + ci * conv_tin;
            for (int kk = 0; kk < conv_k; ++kk, ++r) {
                const int src = t0 + kk * conv_dil;
                if (src >= 0 && src < conv_tin) acc += A[r] * xr[src];
            }
        }
    } else if (trans_b) {  // both rows K-contiguous: eight lanes along k, then the tail
        __global const float* br = B + gn * ldb;
        float8 acc8 = (float8)(0.0f);
        int k = 0;
        for (; k + 8 <= K; k += 8) acc8 += vload8(0, A + k) * vload8(0, br + k);
        const float4 h4 = acc8.lo + acc8.hi;
        const float2 h2 = h4.lo + h4.hi;
        acc = h2.lo + h2.hi;
        for (; k < K; ++k) acc += A[k] * br[k];
    } else {
        for (int k = 0; k < K; ++k) acc += A[k] * B[k * ldb + gn];
    }
    float v = acc * alpha;
    if (bias_mode == 1) v = v + bias[gn];
    else if (bias_mode == 2) v = v + bias[(bz % a_mod) * M + gm];
    C[gm * N + gn] = v;
}

// Eight consecutive columns n0..n0+7 of row k of B (plain, transposed or implicit
// im2col as in gemm); columns past N read as 0.
inline float8 load_b8(__global const float* B, const int k, const int n0, const int N,
                      const int ldb, const int trans_b, const int conv_tin, const int conv_k,
                      const int conv_stride, const int conv_dil, const int conv_pad) {
    float v[8];
    if (conv_k > 0) {
        const int ci = k / conv_k;
        const int kk = k - ci * conv_k;
        __global const float* xr = B + ci * conv_tin;
        const int base = n0 * conv_stride + kk * conv_dil - conv_pad;
        if (conv_stride == 1 && base >= 0 && base + 8 <= conv_tin && n0 + 8 <= N)
            return vload8(0, xr + base);
        for (int j = 0; j < 8; ++j) {
            const int src = base + j * conv_stride;
            v[j] = (n0 + j < N && src >= 0 && src < conv_tin) ? xr[src] : 0.0f;
        }
    } else if (!trans_b) {
        if (n0 + 8 <= N) return vload8(0, B + k * ldb + n0);
        for (int j = 0; j < 8; ++j) v[j] = n0 + j < N ? B[k * ldb + n0 + j] : 0.0f;
    } else {
        for (int j = 0; j < 8; ++j) v[j] = n0 + j < N ? B[(n0 + j) * ldb + k] : 0.0f;
    }
    return (float8)(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

inline void store_row8(__global float* C, const float8 acc, const int gm, const int n0,
                       const int N, const float alpha, __global const float* bias,
                       const int bias_mode, const float row_bias) {
    float8 v = acc * alpha;
    if (n0 + 8 <= N) {
        if (bias_mode == 1) v = v + vload8(0, bias + n0);
        else if (bias_mode == 2) v = v + row_bias;
        vstore8(v, 0, C + gm * N + n0);
        return;
    }
    float w[8];
    vstore8(v, 0, w);
    for (int j = 0; j < 8 && n0 + j < N; ++j) {
        float y = w[j];
        if (bias_mode == 1) y = y + bias[n0 + j];
        else if (bias_mode == 2) y = y + row_bias;
        C[gm * N + n0 + j] = y;
    }
}

// Register-blocked GEMM for CPU devices: each work item computes a 4 x 8 block of C
// (four rows of A against an eight-wide vector of B per k), no local memory, no
// barriers. Arguments and batch mapping as gemm; global (ceil(N/8), ceil(M/4), batch).
__kernel void gemm_block(__global float* C, __global const float* A, __global const float* B,
                         __global const float* bias, const int M, const int N, const int K,
                         const int lda, const int ldb, const int trans_b, const int a_mod,
                         const int a_stride, const int b_mod, const int b_stride,
                         const float alpha, const int bias_mode, const int conv_tin,
                         const int conv_k, const int conv_stride, const int conv_dil,
                         const int conv_pad) {
#pragma OPENCL FP_CONTRACT ON  // a*b+c as one fused multiply-add (mad()/fma() are slow calls on PoCL)
    const int n0 = get_global_id(0) * 8;
    const int m0 = get_global_id(1) * 4;
    const int bz = get_global_id(2);
    if (n0 >= N || m0 >= M) return;
    A += (bz % a_mod) * a_stride;
    B += (bz % b_mod) * b_stride;
    C += bz * M * N;
    __global const float* a0 = A + m0 * lda;
    __global const float* a1 = A + min(m0 + 1, M - 1) * lda;  // rows past M repeat the
    __global const float* a2 = A + min(m0 + 2, M - 1) * lda;  // last one; never stored
    __global const float* a3 = A + min(m0 + 3, M - 1) * lda;
    float8 acc0 = (float8)(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    if (conv_k == 0 && !trans_b && n0 + 8 <= N && m0 + 1 == M) {  // one row (vector x matrix)
        __global const float* bp = B + n0;
        for (int k = 0; k < K; ++k) acc0 += a0[k] * vload8(0, bp + k * ldb);
    } else if (conv_k == 0 && !trans_b && n0 + 8 <= N) {  // plain full block: vector loads
        __global const float* bp = B + n0;
        for (int k = 0; k < K; ++k) {
            const float8 b = vload8(0, bp + k * ldb);
            acc0 += a0[k] * b;
            acc1 += a1[k] * b;
            acc2 += a2[k] * b;
            acc3 += a3[k] * b;
        }
    } else if (conv_k > 0 && conv_stride <= 2 && n0 + 8 <= N) {  // stride 1/2 conv: rows of x
        for (int ci = 0, r = 0; ci < K / conv_k; ++ci) {
            __global const float* xr = B + ci * conv_tin;
            for (int kk = 0; kk < conv_k; ++kk, ++r) {
                const int base = n0 * conv_stride + kk * conv_dil - conv_pad;
                float8 b;
                if (conv_stride == 1 && base >= 0 && base + 8 <= conv_tin)
                    b = vload8(0, xr + base);
                else if (conv_stride == 2 && base >= 0 && base + 16 <= conv_tin)
                    b = vload16(0, xr + base).even;
                else
                    b = load_b8(B, r, n0, N, ldb, 0, conv_tin, conv_k, conv_stride, conv_dil,
                                conv_pad);
                acc0 += a0[r] * b;
                acc1 += a1[r] * b;
                acc2 += a2[r] * b;
                acc3 += a3[r] * b;
            }
        }
    } else {
        for (int k = 0; k < K; ++k) {
            const float8 b = load_b8(B, k, n0, N, ldb, trans_b, conv_tin, conv_k, conv_stride,
                                     conv_dil, conv_pad);
            acc0 += a0[k] * b;
            acc1 += a1[k] * b;
            acc2 += a2[k] * b;
            acc3 += a3[k] * b;
        }
    }
    const int rb2 = bias_mode == 2;  // row bias: this block's four rows
    __global const float* rbias = bias + (rb2 ? (bz % a_mod) * M + m0 : 0);
    store_row8(C, acc0, m0, n0, N, alpha, bias, bias_mode, rb2 ? rbias[0] : 0.0f);
    if (m0 + 1 < M)
        store_row8(C, acc1, m0 + 1, n0, N, alpha, bias, bias_mode, rb2 ? rbias[1] : 0.0f);
    if (m0 + 2 < M)
        store_row8(C, acc2, m0 + 2, n0, N, alpha, bias, bias_mode, rb2 ? rbias[2] : 0.0f);
    if (m0 + 3 < M)
        store_row8(C, acc3, m0 + 3, n0, N, alpha, bias, bias_mode, rb2 ? rbias[3] : 0.0f);
}

// Vector-matrix form for CPU devices (M < 4, B not transposed: Whisper's logits row
// against the [384, 51864] embedding): 32 consecutive columns of one row per work
// item, so each k reads one contiguous 128-byte run of B. Arguments and batch mapping
// as gemm (no conv); global (>= ceil(N / 32), M, batch).
__kernel void gemm_wide(__global float* C, __global const float* A, __global const float* B,
                        __global const float* bias, const int M, const int N, const int K,
                        const int lda, const int ldb, const int trans_b, const int a_mod,
                        const int a_stride, const int b_mod, const int b_stride,
                        const float alpha, const int bias_mode, const int conv_tin,
                        const int conv_k, const int conv_stride, const int conv_dil,
                        const int conv_pad) {
#pragma OPENCL FP_CONTRACT ON
    const int n0 = get_global_id(0) * 32;
    const int gm = get_global_id(1);
    const int bz = get_global_id(2);
    if (n0 >= N || gm >= M) return;
    A += (bz % a_mod) * a_stride + gm * lda;
    B += (bz % b_mod) * b_stride;
    C += bz * M * N;
    const float row_bias = bias_mode == 2 ? bias[(bz % a_mod) * M + gm] : 0.0f;
    if (n0 + 32 <= N) {
        float8 c0 = (float8)(0.0f), c1 = c0, c2 = c0, c3 = c0;
        for (int k = 0; k < K; ++k) {
            const float a = A[k];
            __global const float* bp = B + k * ldb + n0;
            c0 += a * vload8(0, bp);
            c1 += a * vload8(1, bp);
            c2 += a * vload8(2, bp);
            c3 += a * vload8(3, bp);
        }
        store_row8(C, c0, gm, n0, N, alpha, bias, bias_mode, row_bias);
        store_row8(C, c1, gm, n0 + 8, N, alpha, bias, bias_mode, row_bias);
        store_row8(C, c2, gm, n0 + 16, N, alpha, bias, bias_mode, row_bias);
        store_row8(C, c3, gm, n0 + 24, N, alpha, bias, bias_mode, row_bias);
        return;
    }
    for (int n = n0; n < N; ++n) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[k] * B[k * ldb + n];
        float v = acc * alpha;
        if (bias_mode == 1) v = v + bias[n];
        else if (bias_mode == 2) v = v + row_bias;
        C[gm * N + n] = v;
    }
}
