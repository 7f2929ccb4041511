// cotsdl's native CPU kernels: the element-wise passes of L2 pooling, LCN and the
// autoencoder's residual, fused.
//
// Layout: the numpy backend's.  A feature map is (rows, cols, L) with L = C*N
// (pooling, LCN's full-size passes) or N (LCN's smoothed maps, (h, w, N)); the
// innermost L elements of a pixel are contiguous, the two outer dimensions are
// strided (strides in elements, so views of a larger window need no copy).
//
// Thread map: one call computes one band of output rows [i0, i1); Python runs the
// bands on its thread pool (ctypes releases the GIL for the call).  No kernel
// writes outside its band's rows, so bands never race.  The inner loop runs over
// the L contiguous elements and is what the compiler vectorizes.
//
// Numerics: every sum is taken in the same order as the numpy path
// (ops/cpu/pool.py, ops/lcn.py, ops/cpu/lcn.py) and the build turns off FMA
// contraction (-ffp-contract=off), so both paths give the same bits; the tests
// compare them with assert_array_equal.  The one exception is the residual's float64
// sums of squares (a loss to log, not a gradient), which numpy adds in another order.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

namespace {

using idx = long;

// Pool forward: y[i, j] = sqrt(eps + sum_{p, q} x[i*qh + p, j*qw + q]^2), summed over p
// first (per input column), then over q, as numpy does.  Windows up to 3x3 have their
// sizes fixed at compile time: the sums stay in registers and the input streams through
// once (P-paper's 2x2: 9 -> 6 ms on one core against a buffered loop).  With stride 1
// along H, POOL_ROWS output rows go at once: the input rows they share are loaded and
// squared once, not once per window (P-paper's 2x2, stride 1, the loop built standalone and
// timed in the same rounds as the old one: 3.8 -> 2.3 ms on one core, 2.5 -> 1.9 ms on two,
// where torch.compile's fused loop took 2.7 and 2.1; eight rows at once no longer vectorize).
constexpr int POOL_ROWS = 4;

// R output rows [i, i + R) at pixel column j (input rows R + PH - 1 from ``a`` on, one
// apart): the squares first, then each window's sum in the order above.
template <class T, int PH, int PW, int R>
inline void pool_fwd_rows(const T* __restrict__ a, idx sxh, idx sxw, idx L, T eps, T* __restrict__ out,
                          idx syh) {
  for (idx l = 0; l < L; ++l) {
    T s[R + PH - 1][PW];
    for (int r = 0; r < PH - 1; ++r)
      for (int q = 0; q < PW; ++q) {
        const T v = a[r * sxh + q * sxw + l];
        s[r][q] = v * v;
      }
    for (int r = 0; r < R; ++r) {
      for (int q = 0; q < PW; ++q) {  // the window's last row: the one row new to it
        const T v = a[(r + PH - 1) * sxh + q * sxw + l];
        s[r + PH - 1][q] = v * v;
      }
      T acc = T(0);
      for (int q = 0; q < PW; ++q) {
        T c = s[r][q];
        for (int p = 1; p < PH; ++p) c = c + s[r + p][q];
        acc = q == 0 ? c : q == 1 ? (acc + c) + eps : acc + c;
      }
      if (PW == 1) acc = acc + eps;
      out[r * syh + l] = std::sqrt(acc);
    }
  }
}

template <class T, int PH, int PW>
void pool_fwd_fixed(const T* x, idx sxh, idx sxw, idx L, idx qh, idx qw, T eps, T* y, idx syh, idx syw,
                    idx PW_out, idx i0, idx i1) {
  idx i = i0;
  if (qh == 1)
    for (; i + POOL_ROWS <= i1; i += POOL_ROWS)
      for (idx j = 0; j < PW_out; ++j)
        pool_fwd_rows<T, PH, PW, POOL_ROWS>(x + i * sxh + j * qw * sxw, sxh, sxw, L, eps, y + i * syh + j * syw,
                                            syh);
  for (; i < i1; ++i)
    for (idx j = 0; j < PW_out; ++j)
      pool_fwd_rows<T, PH, PW, 1>(x + i * qh * sxh + j * qw * sxw, sxh, sxw, L, eps, y + i * syh + j * syw, syh);
}

// Any window: each output pixel sums its window's columns in a buffer of pw * LB elements.
template <class T>
void pool_fwd(const T* x, idx sxh, idx sxw, idx L, idx ph, idx pw, idx qh, idx qw, T eps,
              T* y, idx syh, idx syw, idx PW, idx i0, idx i1) {
#define COTSDL_FIXED(A, B)                                                          \
  if (ph == A && pw == B)                                                          \
    return pool_fwd_fixed<T, A, B>(x, sxh, sxw, L, qh, qw, eps, y, syh, syw, PW, i0, i1);
  COTSDL_FIXED(1, 1) COTSDL_FIXED(1, 2) COTSDL_FIXED(1, 3) COTSDL_FIXED(2, 1) COTSDL_FIXED(2, 2)
  COTSDL_FIXED(2, 3) COTSDL_FIXED(3, 1) COTSDL_FIXED(3, 2) COTSDL_FIXED(3, 3)
#undef COTSDL_FIXED
  constexpr idx LB = 512;
  std::vector<T> cols(static_cast<size_t>(pw * LB));
  for (idx i = i0; i < i1; ++i)
    for (idx j = 0; j < PW; ++j)
      for (idx l0 = 0; l0 < L; l0 += LB) {
        const idx nl = L - l0 < LB ? L - l0 : LB;
        const T* xw = x + i * qh * sxh + j * qw * sxw + l0;
        for (idx q = 0; q < pw; ++q) {
          T* r = &cols[q * LB];
          const T* a = xw + q * sxw;
          for (idx l = 0; l < nl; ++l) r[l] = a[l] * a[l];
          for (idx p = 1; p < ph; ++p) {
            const T* b = a + p * sxh;
            for (idx l = 0; l < nl; ++l) r[l] = r[l] + b[l] * b[l];
          }
        }
        T* out = y + i * syh + j * syw + l0;
        const T* c0 = &cols[0];
        if (pw == 1) {
          for (idx l = 0; l < nl; ++l) out[l] = std::sqrt(c0[l] + eps);
          continue;
        }
        for (idx l = 0; l < nl; ++l) out[l] = (c0[l] + c0[LB + l]) + eps;
        for (idx q = 2; q < pw; ++q) {
          const T* c = c0 + q * LB;
          for (idx l = 0; l < nl; ++l) out[l] = out[l] + c[l];
        }
        for (idx l = 0; l < nl; ++l) out[l] = std::sqrt(out[l]);
      }
}

// Pool backward, dx rows [h0, h1): g = dy / y (0 where y <= 0) spread along W over the
// window columns (q order), then along H over the window rows (p order), times x.  The
// window rows [i_lo, i_hi) that cover the band are spread into ``spread``, the caller's
// scratch of (i_hi - i_lo + 1) x W x L (a buffer allocated here would be mapped afresh every
// call); its last row holds one window row's g, so each quotient is taken once.
template <class T>
void pool_bwd(const T* dy, const T* y, idx sgh, idx sgw, const T* x, idx sxh, idx sxw, idx W, idx L,
              idx ph, idx pw, idx qh, idx qw, idx PH, idx PW, T* dx, idx sdh, idx sdw, T* spread,
              idx i_lo, idx i_hi, idx h0, idx h1) {
  T* g = spread + (i_hi > i_lo ? i_hi - i_lo : 0) * W * L;
  for (idx i = i_lo; i < i_hi; ++i) {
    for (idx j = 0; j < PW; ++j) {
      const T* a = dy + i * sgh + j * sgw;
      const T* b = y + i * sgh + j * sgw;
      T* gj = g + j * L;
      for (idx l = 0; l < L; ++l) gj[l] = b[l] > T(0) ? a[l] / b[l] : T(0);
    }
    for (idx w = 0; w < W; ++w) {
      T* s = &spread[((i - i_lo) * W + w) * L];
      for (idx l = 0; l < L; ++l) s[l] = T(0);
      for (idx q = 0; q < pw; ++q) {
        if (w - q < 0 || (w - q) % qw) continue;
        const idx j = (w - q) / qw;
        if (j >= PW) continue;
        const T* gj = g + j * L;
        for (idx l = 0; l < L; ++l) s[l] = s[l] + gj[l];
      }
    }
  }
  for (idx h = h0; h < h1; ++h) {
    for (idx w = 0; w < W; ++w) {
      T* out = dx + h * sdh + w * sdw;
      const T* xv = x + h * sxh + w * sxw;
      for (idx l = 0; l < L; ++l) out[l] = T(0);
      for (idx p = 0; p < ph; ++p) {
        if (h - p < 0 || (h - p) % qh) continue;
        const idx i = (h - p) / qh;
        if (i < i_lo || i >= i_hi) continue;
        const T* s = &spread[((i - i_lo) * W + w) * L];
        for (idx l = 0; l < L; ++l) out[l] = out[l] + s[l];
      }
      for (idx l = 0; l < L; ++l) out[l] = out[l] * xv[l];
    }
  }
}

// Separable correlation of a zero-embedded map: for output rows [i0, i1),
//   tmp[i, j'] = sum_k g[k] U[oi + i + k, oj + j'],  out[i, j] = (sum_k g[k] tmp[i, j + k]) / z[i, j]
// with U = u inside rows [r0, r1) x cols [c0, c1) of u, 0 elsewhere.  z may be null.
template <class T>
void corr2(const T* u, idx suh, idx suw, idx N, idx r0, idx r1, idx c0, idx c1, idx oi, idx oj,
           const T* g, idx K, const T* z, T* out, idx soh, idx sow, idx ow, idx i0, idx i1) {
  const idx tw = ow + K - 1;
  std::vector<T> tmp(static_cast<size_t>(tw * N));
  for (idx i = i0; i < i1; ++i) {
    for (idx jj = 0; jj < tw; ++jj) {
      T* t = &tmp[jj * N];
      const idx uc = oj + jj;
      const bool col_in = uc >= c0 && uc < c1;
      for (idx k = 0; k < K; ++k) {
        const idx ur = oi + i + k;
        const T gk = g[k];
        if (col_in && ur >= r0 && ur < r1) {
          const T* a = u + ur * suh + uc * suw;
          if (k == 0) for (idx n = 0; n < N; ++n) t[n] = gk * a[n];
          else for (idx n = 0; n < N; ++n) t[n] = t[n] + gk * a[n];
        } else {  // the zero padding, added as numpy adds it (signs of zero included)
          const T zero = gk * T(0);
          if (k == 0) for (idx n = 0; n < N; ++n) t[n] = zero;
          else for (idx n = 0; n < N; ++n) t[n] = t[n] + zero;
        }
      }
    }
    for (idx j = 0; j < ow; ++j) {
      T* o = out + i * soh + j * sow;
      for (idx n = 0; n < N; ++n) o[n] = g[0] * tmp[j * N + n];
      for (idx k = 1; k < K; ++k) {
        const T* t = &tmp[(j + k) * N];
        for (idx n = 0; n < N; ++n) o[n] = o[n] + g[k] * t[n];
      }
      if (z) {
        const T zz = z[i * ow + j];
        for (idx n = 0; n < N; ++n) o[n] = o[n] / zz;
      }
    }
  }
}

// The channel sum of a (rows, cols, C, N) band, times s: out[h, w, n] = (sum_c x[h, w, c, n]) * s.
template <class T>
void channel_mean(const T* x, idx sxh, idx sxw, idx W, idx C, idx N, T s, T* out, idx soh, idx sow,
                  idx h0, idx h1) {
  for (idx h = h0; h < h1; ++h)
    for (idx w = 0; w < W; ++w) {
      const T* a = x + h * sxh + w * sxw;
      T* o = out + h * soh + w * sow;
      for (idx n = 0; n < N; ++n) o[n] = a[n];
      for (idx c = 1; c < C; ++c)
        for (idx n = 0; n < N; ++n) o[n] = o[n] + a[c * N + n];
      for (idx n = 0; n < N; ++n) o[n] = o[n] * s;
    }
}

// LCN's centring: v = x - mu (mu broadcast over channels) and q = (sum_c v^2) * s.
template <class T>
void centre(const T* x, idx sxh, idx sxw, const T* mu, idx smh, idx smw, idx W, idx C, idx N, T s,
            T* v, idx svh, idx svw, T* q, idx sqh, idx sqw, idx h0, idx h1) {
  for (idx h = h0; h < h1; ++h)
    for (idx w = 0; w < W; ++w) {
      const T* a = x + h * sxh + w * sxw;
      const T* m = mu + h * smh + w * smw;
      T* vo = v + h * svh + w * svw;
      T* qo = q + h * sqh + w * sqw;
      for (idx c = 0; c < C; ++c)
        for (idx n = 0; n < N; ++n) {
          const T d = a[c * N + n] - m[n];
          vo[c * N + n] = d;
          const T sq = d * d;
          qo[n] = c ? qo[n] + sq : sq;
        }
      for (idx n = 0; n < N; ++n) qo[n] = qo[n] * s;
    }
}

// y = v / d, d broadcast over channels.
template <class T>
void divide(const T* v, idx svh, idx svw, const T* d, idx sdh, idx sdw, idx W, idx C, idx N,
            T* y, idx syh, idx syw, idx h0, idx h1) {
  for (idx h = h0; h < h1; ++h)
    for (idx w = 0; w < W; ++w) {
      const T* a = v + h * svh + w * svw;
      const T* b = d + h * sdh + w * sdw;
      T* o = y + h * syh + w * syw;
      for (idx c = 0; c < C; ++c)
        for (idx n = 0; n < N; ++n) o[c * N + n] = a[c * N + n] / b[n];
    }
}

// dd[h, w, n] = sum_c a[h, w, c, n] * b[h, w, c, n].
template <class T>
void channel_dot(const T* a, idx sah, idx saw, const T* b, idx sbh, idx sbw, idx W, idx C, idx N,
                 T* dd, idx sdh, idx sdw, idx h0, idx h1) {
  for (idx h = h0; h < h1; ++h)
    for (idx w = 0; w < W; ++w) {
      const T* x = a + h * sah + w * saw;
      const T* y = b + h * sbh + w * sbw;
      T* o = dd + h * sdh + w * sdw;
      for (idx c = 0; c < C; ++c)
        for (idx n = 0; n < N; ++n) {
          const T p = x[c * N + n] * y[c * N + n];
          o[n] = c ? o[n] + p : p;
        }
    }
}

// LCN backward's spread over r1's rows [h0, h1):
//   t = (v1 * scale) * dq1  (+ dy / d inside the output box, whose rows/cols in r1 start at
//   (or0, oc0) and span (oh, ow)),  dmu = -(sum_c t).  t is written into dv.
template <class T>
void lcn_spread(const T* v1, idx svh, idx svw, const T* dq1, idx sqh, idx sqw, const T* dy, idx syh, idx syw,
                const T* d, idx sdh, idx sdw, idx or0, idx oc0, idx oh, idx ow, idx W, idx C, idx N, T scale,
                T* dv, idx sth, idx stw, T* dmu, idx smh, idx smw, idx h0, idx h1) {
  for (idx h = h0; h < h1; ++h)
    for (idx w = 0; w < W; ++w) {
      const T* a = v1 + h * svh + w * svw;
      const T* g = dq1 + h * sqh + w * sqw;
      T* t = dv + h * sth + w * stw;
      T* m = dmu + h * smh + w * smw;
      const idx oi = h - or0, oj = w - oc0;
      const bool inside = oi >= 0 && oi < oh && oj >= 0 && oj < ow;
      const T* e = inside ? dy + oi * syh + oj * syw : nullptr;
      const T* f = inside ? d + oi * sdh + oj * sdw : nullptr;
      for (idx c = 0; c < C; ++c)
        for (idx n = 0; n < N; ++n) {
          T r = (a[c * N + n] * scale) * g[n];
          if (inside) r = r + e[c * N + n] / f[n];
          t[c * N + n] = r;
          m[n] = c ? m[n] + r : r;
        }
      for (idx n = 0; n < N; ++n) m[n] = -m[n];
    }
}

// LCN backward's max(s, m, eps), pixels of rows [h0, h1) of C-contiguous (h, W, N) maps:
//   v = -dd / (d d);  ds = v where s wins (s >= m, s >= eps), else 0;
//   mpart = v where m wins (s does not, m >= eps), else 0  (summed per image by the caller).
// (Pixels outer, images inner: with one flat loop and n = i % N the compiler vectorized neither.)
template <class T>
void lcn_branches(const T* dd, const T* d, const T* s, const T* m, T eps, T* ds, T* mpart, idx W, idx N,
                  idx h0, idx h1) {
  for (idx p = h0 * W; p < h1 * W; ++p)
    for (idx n = 0, i = p * N; n < N; ++n, ++i) {
      const T v = -dd[i] / (d[i] * d[i]);
      const bool s_wins = s[i] >= m[n] && s[i] >= eps;
      ds[i] = s_wins ? v : T(0);
      mpart[i] = !s_wins && m[n] >= eps ? v : T(0);
    }
}

// du = (ds + q[n]) / (2 s) where s > 0, else 0 (q: the image mean's share, dm / pixels).
template <class T>
void lcn_du(const T* ds, const T* s, const T* q, T* du, idx W, idx N, idx h0, idx h1) {
  for (idx p = h0 * W; p < h1 * W; ++p)
    for (idx n = 0, i = p * N; n < N; ++n, ++i) du[i] = s[i] > T(0) ? (ds[i] + q[n]) / (T(2) * s[i]) : T(0);
}

// x[h, w, c, n] += b[h, w, n].
template <class T>
void add_channels(T* x, idx sxh, idx sxw, const T* b, idx sbh, idx sbw, idx W, idx C, idx N, idx h0, idx h1) {
  for (idx h = h0; h < h1; ++h)
    for (idx w = 0; w < W; ++w) {
      T* a = x + h * sxh + w * sxw;
      const T* e = b + h * sbh + w * sbw;
      for (idx c = 0; c < C; ++c)
        for (idx n = 0; n < N; ++n) a[c * N + n] = a[c * N + n] + e[n];
    }
}

// Eight elements: their residuals stored, and lane k's squares added to rr[k] and xx[k].  The
// compiler vectorized neither type's loop (the float64 sums of floats): written with vector types
// it gives the same bits, on one core 2x faster in float32 and 2.6-4.4x in float64 (A's input,
// (32, 32, 8, 64): 0.41 -> 0.20 ms float32, 0.76 -> 0.17 ms float64).
typedef float F8 __attribute__((vector_size(32)));
typedef float F4 __attribute__((vector_size(16)));
typedef double D4 __attribute__((vector_size(32)));

inline void residual8(const float* a, const float* b, float* o, float scale, D4* rr, D4* xx) {
  F8 va, vb;
  std::memcpy(&va, a, sizeof va);
  std::memcpy(&vb, b, sizeof vb);
  const F8 r = va - vb, s = r * scale;
  std::memcpy(o, &s, sizeof s);  // after both loads: o may be a itself
  F4 h[2], g[2];
  std::memcpy(h, &r, sizeof r);
  std::memcpy(g, &vb, sizeof vb);
  for (int i = 0; i < 2; ++i) {
    const D4 rd = __builtin_convertvector(h[i], D4), xd = __builtin_convertvector(g[i], D4);
    rr[i] += rd * rd;
    xx[i] += xd * xd;
  }
}

inline void residual8(const double* a, const double* b, double* o, double scale, D4* rr, D4* xx) {
  for (int i = 0; i < 2; ++i) {
    D4 va, vb;
    std::memcpy(&va, a + 4 * i, sizeof va);
    std::memcpy(&vb, b + 4 * i, sizeof vb);
    const D4 r = va - vb, s = r * scale;
    std::memcpy(o + 4 * i, &s, sizeof s);
    rr[i] += r * r;
    xx[i] += vb * vb;
  }
}

// The autoencoder's residual over rows [h0, h1) of (H, W, L) maps: r = xh - x and
// out = r * scale (numpy's bits), and per row h the float64 sums of r^2 and x^2 into
// sums[2h] and sums[2h + 1].  Eight partial sums per row (lanes in a fixed order, so any
// bands give the same numbers): one chain of dependent adds was latency-bound.
template <class T>
void residual(const T* xh, idx sah, idx saw, const T* x, idx sxh, idx sxw, idx W, idx L, T scale, T* out,
              idx soh, idx sow, double* sums, idx h0, idx h1) {
  constexpr int P = 8;
  for (idx h = h0; h < h1; ++h) {
    double rr[P] = {}, xx[P] = {};
    for (idx w = 0; w < W; ++w) {
      const T* a = xh + h * sah + w * saw;
      const T* b = x + h * sxh + w * sxw;
      T* o = out + h * soh + w * sow;
      idx l = 0;
      if (L >= P) {
        D4 vr[2], vx[2];
        std::memcpy(vr, rr, sizeof vr);
        std::memcpy(vx, xx, sizeof vx);
        for (; l + P <= L; l += P) residual8(a + l, b + l, o + l, scale, vr, vx);
        std::memcpy(rr, vr, sizeof vr);
        std::memcpy(xx, vx, sizeof vx);
      }
      for (int k = 0; l < L; ++l, ++k) {
        const T r = a[l] - b[l];
        o[l] = r * scale;
        rr[k] += double(r) * double(r);
        xx[k] += double(b[l]) * double(b[l]);
      }
    }
    double sr = 0.0, sx = 0.0;
    for (int k = 0; k < P; ++k) {
      sr += rr[k];
      sx += xx[k];
    }
    sums[2 * h] = sr;
    sums[2 * h + 1] = sx;
  }
}

}  // namespace

#define COTSDL_EXPORT extern "C" __attribute__((visibility("default")))
#define COTSDL_BOTH(X) X(float, f32) X(double, f64)

#define POOL_FWD(T, S)                                                                                        \
  COTSDL_EXPORT void cotsdl_pool_fwd_##S(const T* x, idx sxh, idx sxw, idx L, idx ph, idx pw, idx qh, idx qw, \
                                         T eps, T* y, idx syh, idx syw, idx PW, idx i0, idx i1) {             \
    pool_fwd<T>(x, sxh, sxw, L, ph, pw, qh, qw, eps, y, syh, syw, PW, i0, i1);                                \
  }
#define POOL_BWD(T, S)                                                                                          \
  COTSDL_EXPORT void cotsdl_pool_bwd_##S(const T* dy, const T* y, idx sgh, idx sgw, const T* x, idx sxh,       \
                                         idx sxw, idx W, idx L, idx ph, idx pw, idx qh, idx qw, idx PH, idx PW, \
                                         T* dx, idx sdh, idx sdw, T* spread, idx i_lo, idx i_hi, idx h0,      \
                                         idx h1) {                                                            \
    pool_bwd<T>(dy, y, sgh, sgw, x, sxh, sxw, W, L, ph, pw, qh, qw, PH, PW, dx, sdh, sdw, spread, i_lo, i_hi, \
                h0, h1);                                                                                      \
  }
#define CORR2(T, S)                                                                                            \
  COTSDL_EXPORT void cotsdl_corr2_##S(const T* u, idx suh, idx suw, idx N, idx r0, idx r1, idx c0, idx c1,     \
                                      idx oi, idx oj, const T* g, idx K, const T* z, T* out, idx soh, idx sow, \
                                      idx ow, idx i0, idx i1) {                                                \
    corr2<T>(u, suh, suw, N, r0, r1, c0, c1, oi, oj, g, K, z, out, soh, sow, ow, i0, i1);                      \
  }
#define CHANNEL_MEAN(T, S)                                                                                 \
  COTSDL_EXPORT void cotsdl_channel_mean_##S(const T* x, idx sxh, idx sxw, idx W, idx C, idx N, T s, T* o, \
                                             idx soh, idx sow, idx h0, idx h1) {                           \
    channel_mean<T>(x, sxh, sxw, W, C, N, s, o, soh, sow, h0, h1);                                         \
  }
#define CENTRE(T, S)                                                                                          \
  COTSDL_EXPORT void cotsdl_centre_##S(const T* x, idx sxh, idx sxw, const T* mu, idx smh, idx smw, idx W,    \
                                       idx C, idx N, T s, T* v, idx svh, idx svw, T* q, idx sqh, idx sqw,     \
                                       idx h0, idx h1) {                                                      \
    centre<T>(x, sxh, sxw, mu, smh, smw, W, C, N, s, v, svh, svw, q, sqh, sqw, h0, h1);                       \
  }
#define DIVIDE(T, S)                                                                                      \
  COTSDL_EXPORT void cotsdl_divide_##S(const T* v, idx svh, idx svw, const T* d, idx sdh, idx sdw, idx W, \
                                       idx C, idx N, T* y, idx syh, idx syw, idx h0, idx h1) {            \
    divide<T>(v, svh, svw, d, sdh, sdw, W, C, N, y, syh, syw, h0, h1);                                    \
  }
#define CHANNEL_DOT(T, S)                                                                                      \
  COTSDL_EXPORT void cotsdl_channel_dot_##S(const T* a, idx sah, idx saw, const T* b, idx sbh, idx sbw, idx W, \
                                            idx C, idx N, T* dd, idx sdh, idx sdw, idx h0, idx h1) {           \
    channel_dot<T>(a, sah, saw, b, sbh, sbw, W, C, N, dd, sdh, sdw, h0, h1);                                   \
  }
#define LCN_SPREAD(T, S)                                                                                        \
  COTSDL_EXPORT void cotsdl_lcn_spread_##S(const T* v1, idx svh, idx svw, const T* dq1, idx sqh, idx sqw,       \
                                           const T* dy, idx syh, idx syw, const T* d, idx sdh, idx sdw,         \
                                           idx or0, idx oc0, idx oh, idx ow, idx W, idx C, idx N, T scale,      \
                                           T* dv, idx sth, idx stw, T* dmu, idx smh, idx smw, idx h0, idx h1) { \
    lcn_spread<T>(v1, svh, svw, dq1, sqh, sqw, dy, syh, syw, d, sdh, sdw, or0, oc0, oh, ow, W, C, N, scale,     \
                  dv, sth, stw, dmu, smh, smw, h0, h1);                                                         \
  }
#define ADD_CHANNELS(T, S)                                                                                     \
  COTSDL_EXPORT void cotsdl_add_channels_##S(T* x, idx sxh, idx sxw, const T* b, idx sbh, idx sbw, idx W,      \
                                             idx C, idx N, idx h0, idx h1) {                                   \
    add_channels<T>(x, sxh, sxw, b, sbh, sbw, W, C, N, h0, h1);                                                \
  }

#define LCN_BRANCHES(T, S)                                                                                  \
  COTSDL_EXPORT void cotsdl_lcn_branches_##S(const T* dd, const T* d, const T* s, const T* m, T eps, T* ds,   \
                                             T* mpart, idx W, idx N, idx h0, idx h1) {                       \
    lcn_branches<T>(dd, d, s, m, eps, ds, mpart, W, N, h0, h1);                                               \
  }
#define LCN_DU(T, S)                                                                                             \
  COTSDL_EXPORT void cotsdl_lcn_du_##S(const T* ds, const T* s, const T* q, T* du, idx W, idx N, idx h0,        \
                                       idx h1) {                                                                \
    lcn_du<T>(ds, s, q, du, W, N, h0, h1);                                                                       \
  }

#define RESIDUAL(T, S)                                                                                          \
  COTSDL_EXPORT void cotsdl_residual_##S(const T* xh, idx sah, idx saw, const T* x, idx sxh, idx sxw, idx W, idx L, \
                                         T scale, T* out, idx soh, idx sow, double* sums, idx h0, idx h1) {       \
    residual<T>(xh, sah, saw, x, sxh, sxw, W, L, scale, out, soh, sow, sums, h0, h1);                            \
  }

COTSDL_BOTH(POOL_FWD)
COTSDL_BOTH(POOL_BWD)
COTSDL_BOTH(CORR2)
COTSDL_BOTH(CHANNEL_MEAN)
COTSDL_BOTH(CENTRE)
COTSDL_BOTH(DIVIDE)
COTSDL_BOTH(CHANNEL_DOT)
COTSDL_BOTH(LCN_SPREAD)
COTSDL_BOTH(ADD_CHANNELS)
COTSDL_BOTH(LCN_BRANCHES)
COTSDL_BOTH(LCN_DU)
COTSDL_BOTH(RESIDUAL)
