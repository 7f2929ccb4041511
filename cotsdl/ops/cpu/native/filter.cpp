// cotsdl's native CPU kernels: the block locally-connected filter's three passes, as
// small matrix products that read their operands where they lie (no gathered copy).
//
// Layout (DESIGN.md section 3, ops/cpu/filter.py): x (H, W, C, N), weights w (SH, SW, M,
// rh, rw, C) C-contiguous with M = bh*bw*K, y (SH*bh, SW*bw, K, N).  The N images are
// contiguous in x, y, dy and dx; their other strides are in elements, so views need no
// copy.  Per site s = (i, j), Y_s (M x N) = W_s (M x R) X_s (R x N) with R = rh*rw*C:
// field row k = (p, q, c) of X_s is the N-vector at
//     x + (i*sh + p)*sx0 + (j*sw + q)*sx1 + c*sx2         (table `xoff`, R offsets)
// and neuron m = (a*bw + b)*K + k of Y_s is the row at
//     y + (i*bh + a)*sy0 + (j*bw + b)*sy1 + k*sy2         (table `yoff`, M offsets).
//
//   forward           Y_s   = W_s X_s          rows m, columns n, reduction over k
//   backward-data     dX_s += W_s^T dY_s       rows k, columns n, reduction over m
//   backward-weights  dW_s (+)= dY_s X_s^T     rows m, columns k, reduction over n
// Backward-weights packs dY_s^T (N x M) and X_s^T (panels of 2L field rows, n-major) per
// site into the caller's scratch; with `add` it adds to dW, and with a second pair (x2, dy2)
// it sums both products in one reduction (a tied autoencoder's two weight gradients).  With
// `fields` (ops/cpu/filter.by_fields: fewer neurons than images, in whole vectors) it goes by
// fields instead: T_s = X_s dY_s^T (R x M) with X_s read in place like forward, then
// dW_s = T_s^T by L x L register transposes, which copies R*M numbers a site instead of
// packing R*N (lc_bwd_w_fields).
//
// Backward-data by rows of dx (lc_bwd_data_rows) instead sums each dx number over all the
// sites covering it in registers and stores it once; Python picks one of the two ways by a
// model of their memory traffic (ops/cpu/filter.by_dx_rows).
//
// Thread map: one call computes the sites [s0, s1) (forward, backward-weights: a site
// writes only its own outputs), the site rows [i0, i1) (backward-data by sites adds into
// dx rows that the next ceil(rh/sh) - 1 site rows add to too, so Python runs site-row
// blocks of one colour at a time, ops/cpu/parallel.colored_blocks) or the dx rows
// [h0, h1) (backward-data by rows).  Python runs the calls on its thread pool; ctypes
// releases the GIL.
//
// Register tile: MR = 6 rows x NV = 2 vectors of 32 bytes (12 accumulators of 16 AVX
// registers), one broadcast per row
// and NV loads per step of the reduction.  Rows outermost, so a tile's A rows stay in
// L1 while the columns sweep.  Columns past the last whole vector take a scalar loop.
// The vectors are GCC/Clang vector extensions: AVX2 with -march=native on x86, split
// into narrower registers elsewhere.
//
// Numerics: unlike kernels.cpp this file contracts products into FMAs (the pragma
// below), and each output sums its reduction in order (k, m or n ascending).  Results
// agree with the numpy path (BLAS) to rounding, not bit for bit.
#include <cstddef>
#include <cstring>
#include <vector>

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

namespace {

using idx = long;
// Rows of w that a chunk of backward-data's reduction touches at once.  P-paper's rows are a
// page apart: chunks of 16 rows ran backward-data at 53-55 GFLOP/s on one core, of 32 at
// 43-44, of 128 at 44-47.  Up to 32 rows stay whole (a split adds a pass over the output:
// 8% on B's backward-data).
idx chunk(idx rows) { return rows <= 32 ? rows : 16; }

template <class T>
struct Vec;
template <>
struct Vec<float> {
  typedef float type __attribute__((vector_size(32)));
  static constexpr int L = 8;
};
template <>
struct Vec<double> {
  typedef double type __attribute__((vector_size(32)));
  static constexpr int L = 4;
};

template <class T>
inline typename Vec<T>::type load(const T* p) {
  typename Vec<T>::type v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
inline void store(T* p, typename Vec<T>::type v) {
  std::memcpy(p, &v, sizeof v);
}

// Broadcasts written out (V{} + a would add 0.0 first, since -0.0 + 0.0 != -0.0; a loop over
// the lanes is not recognized as a broadcast and spills the accumulators).
inline Vec<float>::type splat(float a) { return Vec<float>::type{a, a, a, a, a, a, a, a}; }
inline Vec<double>::type splat(double a) { return Vec<double>::type{a, a, a, a}; }

// Two vectors' lanes picked by constant indices (0..2L-1 over a, then b).
#if defined(__clang__)
#define COTSDL_SHUFFLE(V, a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define COTSDL_SHUFFLE(V, a, b, ...) __builtin_shuffle(a, b, Mask<V>::type{__VA_ARGS__})
#endif

template <class V>
struct Mask;
template <>
struct Mask<Vec<float>::type> {
  typedef int type __attribute__((vector_size(32)));
};
template <>
struct Mask<Vec<double>::type> {
  typedef long long type __attribute__((vector_size(32)));
};

// An L x L block transposed in registers: r[i][l] -> r[l][i] (unpack, shuffle, swap halves).
inline void transpose(Vec<float>::type* r) {
  using V = Vec<float>::type;
  V t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = COTSDL_SHUFFLE(V, r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = COTSDL_SHUFFLE(V, r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int h = 0; h < 8; h += 4)
    for (int j = 0; j < 2; ++j) {
      u[h + 2 * j] = COTSDL_SHUFFLE(V, t[h + j], t[h + j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[h + 2 * j + 1] = COTSDL_SHUFFLE(V, t[h + j], t[h + j + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int l = 0; l < 4; ++l) {
    r[l] = COTSDL_SHUFFLE(V, u[l], u[l + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[l + 4] = COTSDL_SHUFFLE(V, u[l], u[l + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

inline void transpose(Vec<double>::type* r) {
  using V = Vec<double>::type;
  const V t0 = COTSDL_SHUFFLE(V, r[0], r[1], 0, 4, 2, 6), t1 = COTSDL_SHUFFLE(V, r[0], r[1], 1, 5, 3, 7);
  const V t2 = COTSDL_SHUFFLE(V, r[2], r[3], 0, 4, 2, 6), t3 = COTSDL_SHUFFLE(V, r[2], r[3], 1, 5, 3, 7);
  r[0] = COTSDL_SHUFFLE(V, t0, t2, 0, 1, 4, 5);
  r[1] = COTSDL_SHUFFLE(V, t1, t3, 0, 1, 4, 5);
  r[2] = COTSDL_SHUFFLE(V, t0, t2, 2, 3, 6, 7);
  r[3] = COTSDL_SHUFFLE(V, t1, t3, 2, 3, 6, 7);
}

// C (= or +=) A B: rows r, columns l, a reduction over k.
//   A(r, k) = arow[r][k], or, without row pointers, a[k*ak + r]
//   B(k, l) = b[boff[k] + l]            C(r, l) = c[r][l]
// Without row pointers a tile's A needs one register, not MR (with MR pointers GCC spills
// them and the loop becomes load-bound).
enum Out { SET, ADD };

template <class T>
struct Product {
  const T* const* arow;
  const T* a;
  idx ak;
  const T* b;
  const idx* boff;
  T* const* c;
};

// MR x NV accumulators: zeroed, then stored (= or +=) into rows [r, r + MR), columns [n0, ...).
template <class T, int MR, int NV>
struct Acc {
  typename Vec<T>::type v[MR][NV];
  Acc() {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) v[i][j] = typename Vec<T>::type{};
  }
  // row i += a[i] * bv: A's MR rows of one reduction step, consecutive
  inline void fma(const T* a, const typename Vec<T>::type* bv) {
    for (int i = 0; i < MR; ++i) {
      const typename Vec<T>::type ai = splat(a[i]);
      for (int j = 0; j < NV; ++j) v[i][j] += ai * bv[j];
    }
  }
  template <Out O>
  inline void store_to(T* const* c, idx n0) const {
    constexpr int L = Vec<T>::L;
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) {
        T* p = c[i] + n0 + j * L;
        store<T>(p, O == ADD ? load<T>(p) + v[i][j] : v[i][j]);
      }
  }
};

template <class T, int NV>
inline void load_row(const T* p, typename Vec<T>::type* bv) {
  for (int j = 0; j < NV; ++j) bv[j] = load<T>(p + j * Vec<T>::L);
}

// A product over the reduction [k0, k1): the tiles the row blocks below call.
template <class T>
struct Span {
  const Product<T>& P;
  idx k0, k1;

  // Rows [r, r + MR), columns [n0, n0 + L*NV).
  template <int MR, int NV, Out O>
  inline void tile(idx r, idx n0) const {
    Acc<T, MR, NV> acc;
    typename Vec<T>::type bv[NV];
    if (P.arow) {
      const T* ap[MR];
      for (int i = 0; i < MR; ++i) ap[i] = P.arow[r + i];
      for (idx k = k0; k < k1; ++k) {
        load_row<T, NV>(P.b + P.boff[k] + n0, bv);
        for (int i = 0; i < MR; ++i) {
          const typename Vec<T>::type ai = splat(ap[i][k]);
          for (int j = 0; j < NV; ++j) acc.v[i][j] += ai * bv[j];
        }
      }
    } else {
      for (idx k = k0; k < k1; ++k) {
        load_row<T, NV>(P.b + P.boff[k] + n0, bv);
        acc.fma(P.a + k * P.ak + r, bv);
      }
    }
    acc.template store_to<O>(P.c + r, n0);
  }

  // The same, one number at a time, for the columns [n0, n1) that do not fill a vector.
  template <Out O>
  void tail(idx r, int mr, idx n0, idx n1) const {
    for (int i = 0; i < mr; ++i)
      for (idx n = n0; n < n1; ++n) {
        T s = T(0);
        for (idx k = k0; k < k1; ++k) s += (P.arow ? P.arow[r + i][k] : P.a[k * P.ak + r + i]) * P.b[P.boff[k] + n];
        T& out = P.c[r + i][n];
        out = O == ADD ? out + s : s;
      }
  }
};

// Rows [r, r + MR) of a product S (a Span, or Sites below), columns [n0, n1).
template <class T, int MR, int NV, Out O, class S>
void row_block(const S& P, idx r, idx n0, idx n1) {
  constexpr int L = Vec<T>::L;
  for (; n0 + NV * L <= n1; n0 += NV * L) P.template tile<MR, NV, O>(r, n0);
  for (; NV > 1 && n0 + L <= n1; n0 += L) P.template tile<MR, 1, O>(r, n0);
  if (n0 < n1) P.template tail<O>(r, MR, n0, n1);
}

// Rows [r0, r1): blocks of 6, then the rest.
template <class T, Out O, class S>
void rows_of(const S& P, idx r0, idx r1, idx n0, idx n1) {
  idx r = r0;
  for (; r + 6 <= r1; r += 6) row_block<T, 6, 2, O>(P, r, n0, n1);
  switch (r1 - r) {
    case 5: row_block<T, 5, 2, O>(P, r, n0, n1); break;
    case 4: row_block<T, 4, 2, O>(P, r, n0, n1); break;
    case 3: row_block<T, 3, 2, O>(P, r, n0, n1); break;
    case 2: row_block<T, 2, 2, O>(P, r, n0, n1); break;
    case 1: row_block<T, 1, 2, O>(P, r, n0, n1); break;
    default: break;
  }
}

// C = A B over `rows` rows, `ncols` columns and a reduction of `kn`, the reduction in chunks
// of `kc` (after the first, each chunk adds to C): the rows of A a chunk touches then fit
// in the TLB (P-paper's weight rows are a page apart).
template <class T, Out O>
void panel(const Product<T>& P, idx rows, idx kn, idx ncols, idx kc) {
  for (idx k0 = 0; k0 < kn; k0 += kc) {
    const idx k1 = k0 + kc < kn ? k0 + kc : kn;
    const Span<T> S{P, k0, k1};
    if (k0 == 0 || O == ADD)
      rows_of<T, O>(S, 0, rows, 0, ncols);
    else
      rows_of<T, ADD>(S, 0, rows, 0, ncols);
  }
}

// Offsets of a site's field rows k = (p, q, c) and of its neurons m = (a, b, k).
std::vector<idx> field_offsets(idx rh, idx rw, idx C, idx s0, idx s1, idx s2) {
  std::vector<idx> off(rh * rw * C);
  for (idx p = 0, k = 0; p < rh; ++p)
    for (idx q = 0; q < rw; ++q)
      for (idx c = 0; c < C; ++c) off[k++] = p * s0 + q * s1 + c * s2;
  return off;
}

template <class T>
void lc_fwd(const T* x, idx sx0, idx sx1, idx sx2, idx C, idx N, const T* w, idx rh, idx rw, idx sh, idx sw,
            idx SW, T* y, idx sy0, idx sy1, idx sy2, idx bh, idx bw, idx K, idx s0, idx s1) {
  const idx R = rh * rw * C, M = bh * bw * K;
  const std::vector<idx> xoff = field_offsets(rh, rw, C, sx0, sx1, sx2);
  const std::vector<idx> yoff = field_offsets(bh, bw, K, sy0, sy1, sy2);
  std::vector<const T*> a(M);
  std::vector<T*> c(M);
  for (idx s = s0; s < s1; ++s) {
    const idx i = s / SW, j = s % SW;
    const T* ws = w + s * M * R;
    T* yb = y + i * bh * sy0 + j * bw * sy1;
    for (idx m = 0; m < M; ++m) {
      a[m] = ws + m * R;
      c[m] = yb + yoff[m];
    }
    const Product<T> P{a.data(), nullptr, 1, x + i * sh * sx0 + j * sw * sx1, xoff.data(), c.data()};
    panel<T, SET>(P, M, R, N, R);
  }
}

template <class T>
void lc_bwd_data(const T* dy, idx sd0, idx sd1, idx sd2, const T* w, idx rh, idx rw, idx C, idx N, idx sh, idx sw,
                 idx SW, idx bh, idx bw, idx K, T* dx, idx sx0, idx sx1, idx sx2, idx i0, idx i1) {
  const idx R = rh * rw * C, M = bh * bw * K;
  const std::vector<idx> xoff = field_offsets(rh, rw, C, sx0, sx1, sx2);
  const std::vector<idx> dyoff = field_offsets(bh, bw, K, sd0, sd1, sd2);
  std::vector<T*> c(R);
  for (idx i = i0; i < i1; ++i)
    for (idx j = 0; j < SW; ++j) {  // in order: the sites of a row overlap
      const T* ws = w + (i * SW + j) * M * R;
      T* xb = dx + i * sh * sx0 + j * sw * sx1;
      for (idx k = 0; k < R; ++k) c[k] = xb + xoff[k];
      const Product<T> P{nullptr, ws, R, dy + i * bh * sd0 + j * bw * sd1, dyoff.data(), c.data()};
      panel<T, ADD>(P, R, M, N, chunk(M));
    }
}

// Backward-data by rows of dx: the dx numbers at (h, w, c) for a run of columns w that the
// same sites cover, each summed over all of its sites in registers and stored once.
// A((w, c), (g, m)) = a[g][m*ak + (w - w0)*C + c] (site g's weights: consecutive w and c are
// consecutive field rows); B((g, m), n) = b[g][boff[m] + n] (site g's dy rows).
template <class T>
struct Sites {
  const T* const* a;
  const T* const* b;
  idx g0, g1, M, ak;
  const idx* boff;
  T* const* c;

  template <int MR, int NV, Out O>
  inline void tile(idx r, idx n0) const {
    Acc<T, MR, NV> acc;
    typename Vec<T>::type bv[NV];
    for (idx g = g0; g < g1; ++g) {
      const T* as = a[g] + r;
      const T* bs = b[g] + n0;
      for (idx m = 0; m < M; ++m) {
        load_row<T, NV>(bs + boff[m], bv);
        acc.fma(as + m * ak, bv);
      }
    }
    acc.template store_to<O>(c + r, n0);
  }

  template <Out O>
  void tail(idx r, int mr, idx n0, idx n1) const {
    for (int i = 0; i < mr; ++i)
      for (idx n = n0; n < n1; ++n) {
        T s = T(0);
        for (idx g = g0; g < g1; ++g)
          for (idx m = 0; m < M; ++m) s += a[g][m * ak + r + i] * b[g][boff[m] + n];
        T& out = c[r + i][n];
        out = O == ADD ? out + s : s;
      }
  }
};

// dx rows [h0, h1), every number set (those no site covers to 0): no clearing first, no
// colours, threads own disjoint rows.  The reduction runs in chunks of sites of at most
// 256 weight rows (a tile's A rows then stay in L1), the first chunk storing, the rest adding.
template <class T>
void lc_bwd_data_rows(const T* dy, idx sd0, idx sd1, idx sd2, const T* w, idx rh, idx rw, idx C, idx N, idx sh,
                      idx sw, idx SH, idx SW, idx bh, idx bw, idx K, T* dx, idx sx0, idx sx1, idx sx2, idx W, idx h0,
                      idx h1) {
  const idx R = rh * rw * C, M = bh * bw * K, per = M < 256 ? 256 / M : 1;
  const std::vector<idx> dyoff = field_offsets(bh, bw, K, sd0, sd1, sd2);
  // The sites covering index x of an axis of fields `r` long at stride `s`, `n` of them: [lo, hi].
  auto lo = [](idx x, idx r, idx s) { return x >= r ? (x - r) / s + 1 : 0; };
  auto hi = [](idx x, idx s, idx n) { return x / s < n - 1 ? x / s : n - 1; };
  std::vector<const T*> a, b;
  std::vector<T*> c;
  for (idx h = h0; h < h1; ++h) {
    const idx i0 = lo(h, rh, sh), i1 = hi(h, sh, SH);
    for (idx w0 = 0, w1; w0 < W; w0 = w1) {
      const idx j0 = lo(w0, rw, sw), j1 = hi(w0, sw, SW);
      for (w1 = w0 + 1; w1 < W && lo(w1, rw, sw) == j0 && hi(w1, sw, SW) == j1;) ++w1;
      a.clear();
      b.clear();
      c.clear();
      for (idx i = i0; i <= i1; ++i)
        for (idx j = j0; j <= j1; ++j) {
          a.push_back(w + (i * SW + j) * M * R + ((h - i * sh) * rw + w0 - j * sw) * C);
          b.push_back(dy + i * bh * sd0 + j * bw * sd1);
        }
      for (idx x = w0; x < w1; ++x)
        for (idx ch = 0; ch < C; ++ch) c.push_back(dx + h * sx0 + x * sx1 + ch * sx2);
      const idx sites = (idx)a.size(), rows = (idx)c.size();
      for (idx g0 = 0; g0 < sites || g0 == 0; g0 += per) {  // no sites: one pass storing zeros
        const Sites<T> S{a.data(), b.data(), g0, g0 + per < sites ? g0 + per : sites, M, R, dyoff.data(), c.data()};
        if (g0 == 0)
          rows_of<T, SET>(S, 0, rows, 0, N);
        else
          rows_of<T, ADD>(S, 0, rows, 0, N);
      }
    }
  }
}

// X_s's rows rows[0..L) as N x L (n-major) at pk, row n at pk + n * ps: L x L blocks
// transposed in registers.
template <class T>
void pack_rows(const T* const* rows, idx N, T* pk, idx ps) {
  using V = typename Vec<T>::type;
  constexpr int L = Vec<T>::L;
  idx n = 0;
  for (; n + L <= N; n += L) {
    V blk[L];
    for (int i = 0; i < L; ++i) blk[i] = load<T>(rows[i] + n);
    transpose(blk);
    for (int l = 0; l < L; ++l) store<T>(pk + (n + l) * ps, blk[l]);
  }
  for (; n < N; ++n)
    for (int i = 0; i < L; ++i) pk[n * ps + i] = rows[i][n];
}

// One (x, dy) pair of backward-weights: the arrays and their strides (elements).
template <class T>
struct Pair {
  const T* x;
  idx sx0, sx1, sx2;
  const T* dy;
  idx sd0, sd1, sd2;
};

// The pairs' offsets, and per site and pair what both ways of backward-weights start from:
// dY_s^T packed (N x M, row n at dyt + n*M) and the pointers to X_s's field rows.
template <class T>
struct SitePairs {
  const Pair<T>* pairs;
  idx N, M, R, sh, sw, bh, bw, SW;
  std::vector<std::vector<idx>> xoff, dyoff;
  SitePairs(const Pair<T>* p, idx np, idx C, idx n, idx rh, idx rw, idx sh_, idx sw_, idx SW_, idx bh_, idx bw_,
            idx K)
      : pairs(p), N(n), M(bh_ * bw_ * K), R(rh * rw * C), sh(sh_), sw(sw_), bh(bh_), bw(bw_), SW(SW_) {
    for (idx t = 0; t < np; ++t) {
      xoff.push_back(field_offsets(rh, rw, C, p[t].sx0, p[t].sx1, p[t].sx2));
      dyoff.push_back(field_offsets(bh, bw, K, p[t].sd0, p[t].sd1, p[t].sd2));
    }
  }
  void load(idx s, idx t, T* dyt, const T** a) const {
    const idx i = s / SW, j = s % SW;
    const Pair<T>& pr = pairs[t];
    const T* xb = pr.x + i * sh * pr.sx0 + j * sw * pr.sx1;
    const T* db = pr.dy + i * bh * pr.sd0 + j * bw * pr.sd1;
    for (idx m = 0; m < M; ++m)
      for (idx n = 0; n < N; ++n) dyt[n * M + m] = db[dyoff[t][m] + n];
    for (idx k = 0; k < R; ++k) a[k] = xb + xoff[t][k];
  }
};

// dW_s (M x R) = sum over the pairs of dY_s X_s^T, as the 6 x 2L tiles of the other passes:
// rows m, columns r, a reduction over the pairs' n (np * N long).  A = the dY_s^T packed
// one under the other, (np N) x M (A(m, n) = dyt[n*M + m]); B = the X_s^T likewise, in panels
// of 2L field rows, each (np N) x 2L (n-major); a tile stores its 2L columns, one cache
// line, straight into dW's row m (no transpose).  Two pairs (a tied autoencoder's encoder and
// decoder) make one reduction twice as long: dW is written once instead of written, read
// and written again.
template <class T, Out O>
void lc_bwd_w(const Pair<T>* pairs, idx np, idx C, idx N, idx rh, idx rw, idx sh, idx sw, idx SW, idx bh, idx bw,
              idx K, T* dw, T* scratch, idx s0, idx s1) {
  constexpr int L = Vec<T>::L, B = 2 * L;
  const idx R = rh * rw * C, M = bh * bw * K, panels = (R + B - 1) / B, NN = np * N;
  const SitePairs<T> site(pairs, np, C, N, rh, rw, sh, sw, SW, bh, bw, K);
  std::vector<idx> boff(NN);
  for (idx n = 0; n < NN; ++n) boff[n] = n * B;
  std::vector<const T*> a(R);
  std::vector<T*> c(M);
  T* dyt = scratch;          // dY_s^T, NN x M
  T* pk = scratch + NN * M;  // X_s^T in panels of B rows: panels x NN x B
  for (idx s = s0; s < s1; ++s) {
    for (idx t = 0; t < np; ++t) {
      site.load(s, t, dyt + t * N * M, a.data());
      for (idx k = 0; k < R; k += L) {
        T* p = pk + (k / B) * NN * B + t * N * B + k % B;
        if (k + L <= R) {
          pack_rows<T>(a.data() + k, N, p, B);
        } else {
          for (idx n = 0; n < N; ++n)
            for (idx r = k; r < R; ++r) p[n * B + r - k] = a[r][n];
        }
      }
    }
    T* dws = dw + s * M * R;
    // One tile's rows (neurons m) outermost, so it stores into 6 rows of dW, each written in
    // order: against chunks of 16 rows, 1.16-1.17x on A, B, C and D and level on P-paper (one
    // core, 80 interleaved rounds each; chunks of 8 and 12 in between).
    for (idx m0 = 0; m0 < M; m0 += 6) {
      const idx m1 = m0 + 6 < M ? m0 + 6 : M;
      for (idx q = 0; q < panels; ++q) {
        const idx r0 = q * B, width = R - r0 < B ? R - r0 : B;
        for (idx m = m0; m < m1; ++m) c[m] = dws + m * R + r0;
        const Product<T> P{nullptr, dyt, M, pk + q * NN * B, boff.data(), c.data()};
        rows_of<T, O>(Span<T>{P, 0, NN}, m0, m1, 0, width);
      }
    }
  }
}

// dW_s (M x R) (+)= an L x L-blocked transpose of T_s (R x M, rows t[k]).
template <class T, Out O>
void transpose_into(T* const* t, idx R, idx M, T* dws) {
  using V = typename Vec<T>::type;
  constexpr int L = Vec<T>::L;
  idx k0 = 0;
  for (; k0 + L <= R; k0 += L) {
    idx m = 0;
    for (; m + L <= M; m += L) {
      V blk[L];
      for (int i = 0; i < L; ++i) blk[i] = load<T>(t[k0 + i] + m);
      transpose(blk);
      for (int l = 0; l < L; ++l) {
        T* p = dws + (m + l) * R + k0;
        store<T>(p, O == ADD ? load<T>(p) + blk[l] : blk[l]);
      }
    }
    for (; m < M; ++m)
      for (int i = 0; i < L; ++i) {
        T& out = dws[m * R + k0 + i];
        out = O == ADD ? out + t[k0 + i][m] : t[k0 + i][m];
      }
  }
  for (; k0 < R; ++k0)
    for (idx m = 0; m < M; ++m) {
      T& out = dws[m * R + k0];
      out = O == ADD ? out + t[k0][m] : t[k0][m];
    }
}

// Backward-weights by fields, where the caller chooses it (ops/cpu/filter.by_fields): T_s = X_s dY_s^T
// (R x M) with rows k, columns m and a reduction over n, X_s's field rows read where they lie in x
// (as forward reads them) and only dY_s^T (N x M) packed; then dW_s = T_s^T.  A site copies R*M
// numbers in the transpose instead of packing R*N for X_s^T (shape A: 4x fewer).  Two pairs: the
// second's product is added to T_s before the transpose, so dW is still written once.
template <class T, Out O>
void lc_bwd_w_fields(const Pair<T>* pairs, idx np, idx C, idx N, idx rh, idx rw, idx sh, idx sw, idx SW, idx bh,
                     idx bw, idx K, T* dw, T* scratch, idx s0, idx s1) {
  const idx R = rh * rw * C, M = bh * bw * K;
  const SitePairs<T> site(pairs, np, C, N, rh, rw, sh, sw, SW, bh, bw, K);
  std::vector<idx> boff(N);
  for (idx n = 0; n < N; ++n) boff[n] = n * M;
  std::vector<const T*> a(R);
  std::vector<T*> c(R);
  T* dyt = scratch;          // dY_s^T, N x M
  T* ts = scratch + N * M;   // T_s, R x M
  for (idx k = 0; k < R; ++k) c[k] = ts + k * M;
  for (idx s = s0; s < s1; ++s) {
    for (idx t = 0; t < np; ++t) {
      site.load(s, t, dyt, a.data());
      const Product<T> P{a.data(), nullptr, 0, dyt, boff.data(), c.data()};
      if (t == 0)
        rows_of<T, SET>(Span<T>{P, 0, N}, 0, R, 0, M);
      else
        rows_of<T, ADD>(Span<T>{P, 0, N}, 0, R, 0, M);
    }
    transpose_into<T, O>(c.data(), R, M, dw + s * M * R);
  }
}

}  // namespace

#define COTSDL_EXPORT extern "C" __attribute__((visibility("default")))

#define COTSDL_FILTER_KERNELS(T, S)                                                                             \
  COTSDL_EXPORT void cotsdl_lc_fwd_##S(const T* x, idx sx0, idx sx1, idx sx2, idx C, idx N, const T* w, idx rh, \
                                       idx rw, idx sh, idx sw, idx SW, T* y, idx sy0, idx sy1, idx sy2, idx bh,  \
                                       idx bw, idx K, idx s0, idx s1) {                                          \
    lc_fwd<T>(x, sx0, sx1, sx2, C, N, w, rh, rw, sh, sw, SW, y, sy0, sy1, sy2, bh, bw, K, s0, s1);               \
  }                                                                                                              \
  COTSDL_EXPORT void cotsdl_lc_bwd_data_##S(const T* dy, idx sd0, idx sd1, idx sd2, const T* w, idx rh, idx rw,  \
                                            idx C, idx N, idx sh, idx sw, idx SW, idx bh, idx bw, idx K, T* dx,  \
                                            idx sx0, idx sx1, idx sx2, idx i0, idx i1) {                         \
    lc_bwd_data<T>(dy, sd0, sd1, sd2, w, rh, rw, C, N, sh, sw, SW, bh, bw, K, dx, sx0, sx1, sx2, i0, i1);        \
  }                                                                                                              \
  COTSDL_EXPORT void cotsdl_lc_bwd_data_rows_##S(const T* dy, idx sd0, idx sd1, idx sd2, const T* w, idx rh,     \
                                                 idx rw, idx C, idx N, idx sh, idx sw, idx SH, idx SW, idx bh,  \
                                                 idx bw, idx K, T* dx, idx sx0, idx sx1, idx sx2, idx W, idx h0, \
                                                 idx h1) {                                                      \
    lc_bwd_data_rows<T>(dy, sd0, sd1, sd2, w, rh, rw, C, N, sh, sw, SH, SW, bh, bw, K, dx, sx0, sx1, sx2, W, h0, \
                        h1);                                                                                     \
  }                                                                                                              \
  COTSDL_EXPORT void cotsdl_lc_bwd_w_##S(const T* x, idx sx0, idx sx1, idx sx2, idx C, idx N, const T* dy,       \
                                         idx sd0, idx sd1, idx sd2, const T* x2, idx sx20, idx sx21, idx sx22,   \
                                         const T* dy2, idx sd20, idx sd21, idx sd22, idx rh, idx rw, idx sh,     \
                                         idx sw, idx SW, idx bh, idx bw, idx K, T* dw, idx add, idx fields,      \
                                         T* scratch, idx s0, idx s1) {                                           \
    const Pair<T> pairs[2] = {{x, sx0, sx1, sx2, dy, sd0, sd1, sd2}, {x2, sx20, sx21, sx22, dy2, sd20, sd21, sd22}}; \
    (fields ? (add ? lc_bwd_w_fields<T, ADD> : lc_bwd_w_fields<T, SET>)                                     \
     : (add ? lc_bwd_w<T, ADD> : lc_bwd_w<T, SET>))(pairs, x2 ? 2 : 1, C, N, rh, rw, sh, sw, SW, bh, bw, K, dw,   \
                                               scratch, s0, s1);                                                \
  }

COTSDL_FILTER_KERNELS(float, f32)
COTSDL_FILTER_KERNELS(double, f64)
