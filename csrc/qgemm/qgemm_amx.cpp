// The AMX quantized product (Intel Sapphire Rapids and later: AMX-TILE + AMX-INT8) for
// products of 10 to 32 input rows (verification of drafts); other row counts take the
// AVX-512 VNNI product (gemm_avx512vnni). Layout and canonical arithmetic: qkernels.h.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c -mamx-tile
// -mamx-int8; called only where kernel_common.h's cpu_has_isa(kAvx512Amx) holds (the CPU
// has the instructions and the OS granted this process the tile state).
//
// Measured on the lent device's Intel Xeon host (Sapphire Rapids, 2 threads, 2026-11-30,
// benchmarks/experiments/exp_rows_cost.py, the two products alternated, median of 9 paired ratios; docs/
// BENCHMARKS.md): AMX / VNNI time over 8 layers of the SmolLM2-1.7B shape (Q4_K / Q6_K)
// 1.00 at 9 rows, 0.84 at 10, 0.82 at 12, 0.84 at 16, 0.92 at 24, 0.95 at 32, 1.17 at 64,
// 1.08 at 512; Llama-3.1-8B shape 1.07 at 9, 0.89 at 16, 0.97 at 32, 1.32 at 64. Hence
// the range: one tile of 9 rows is mostly empty work, and 64+ rows (prefill) are
// bound by the float steps, which the VNNI product interleaves better with its dots.
//
// One tdpbsud per (group of 16 weight rows, sub-block, tile of 9 to 16 input rows):
//   C[m][r] = sum_k q[m][k] * u[r][k]   (int8 activations x u8 weights, exact in int32)
// The weight layout of a sub-block is already a B tile: its 64-byte vector c holds the
// 4 u of k = 4c..4c+3 for each of the 16 rows in lane r, which is tdpbsud's B row c
// (u4 storage is unpacked to that form in a 512-byte staging buffer first, MXFP4 codes
// read as their u through kE2M1U on the way). The A tile
// is SB bytes of each activation row (stride K). C is stored, and each row takes the
// same float steps as on every other path (isum = C - z * xs, then the fma chain of
// qkernels.h), so the bits are those of every other path: integer sums are exact in any
// order, and a row's float steps never see another row. The canonical arithmetic keeps
// a float step per sub-block of 32 (or 16), so a tile product is 32 deep at most (half
// of what one tdpbsud can take) and the float steps stay on the vector unit; what the
// tiles save is the integer dots (8 vpdpbusd per row and sub-block).
//
// Everything here has internal linkage except gemm_avx512amx.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "qgemm/qkernels.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
namespace qk {
namespace {

constexpr int64_t kMinRows = 10;  // fewer or more rows: the VNNI product (see above)
constexpr int64_t kMaxRows = 32;
constexpr int kTileRows = 16;     // rows of an A or C tile (AMX's maximum)

// The tile registers of palette 1: two C (int32 [rows][16]), two A (int8 [rows][SB]) and
// two B (u8 [SB/4][64]) tiles, used in turn so that one tile's product overlaps the
// float steps of the one before.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

template <int SB>
void configure(int rows) {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette_id = 1;
  for (int t = 0; t < 2; ++t) {
    c.rows[t] = uint8_t(rows);  // tmm0, tmm1: C
    c.colsb[t] = 64;
    c.rows[2 + t] = uint8_t(rows);  // tmm2, tmm3: A
    c.colsb[2 + t] = SB;
    c.rows[4 + t] = SB / 4;  // tmm4, tmm5: B
    c.colsb[4 + t] = 64;
  }
  _tile_loadconfig(&c);
}

// Tile slot s (0 or 1): C = tmm s, A = tmm 2+s, B = tmm 4+s. C = A . B for the R rows of
// activations at a (stride lda) and the weight tile at wt (64-byte rows), stored to c.
// (The intrinsics name tile registers by literal numbers, hence both spelled out.)
inline void tile_product(int slot, const uint8_t* wt, const int8_t* a, int64_t lda, int32_t* c) {
  if (slot == 0) {
    _tile_loadd(4, wt, 64); _tile_loadd(2, a, lda); _tile_zero(0);
    _tile_dpbsud(0, 2, 4); _tile_stored(0, c, 64);
  } else {
    _tile_loadd(5, wt, 64); _tile_loadd(3, a, lda); _tile_zero(1);
    _tile_dpbsud(1, 3, 5); _tile_stored(1, c, 64);
  }
}

// The scales (or mins) of the 16 lanes of group g in sub-block b (as qgemm_avx512.inc).
template <int SB>
inline __m512 load_scales(const QW& w, const void* p, int64_t g, int64_t b) {
  if (w.sfmt == kKS) {
    const uint8_t* t = static_cast<const uint8_t*>(p);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(t + KS<SB>::d(w, g, b))));
    const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(t + KS<SB>::sc(w, g, b))));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
  }
  const int64_t i = (g * (w.k / SB) + b) * 16;
  if (w.sfmt == kF16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(static_cast<const uint16_t*>(p) + i)));
  if (w.sfmt == kE8) {  // e8m0_half_bits per lane: e < 2 the subnormals, else (e - 1) << 23
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(static_cast<const uint8_t*>(p) + i)));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub));
  }
  return _mm512_loadu_ps(static_cast<const float*>(p) + i);
}

// The low nibbles of v as bytes: u4 values (U4 = kNibU), or MXFP4 codes read as their u
// through kE2M1U (kNibCodes; vpshufb per 128-bit lane, the table in each).
template <int U4>
inline __m512i nibble_u(__m512i v) {
  const __m512i c = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
  if constexpr (U4 == kNibCodes)
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)kE2M1U)), c);
  return c;
}

// Group g x input rows [m, m + R) (9 <= R <= 16, the tiles configured for R rows): the R
// accumulators stay in registers for the whole of K. a: those rows' activations laid out
// as [K/SB][R][SB] (run); wpre: null, or (u4) the group's sub-blocks unpacked to B tiles
// [K/SB][512]. Sub-block b's tile product goes to the ring slot b % kRing of c; its float
// steps run kLag sub-blocks later, so the tile unit works ahead while the vector unit
// reads what it stored. Each row still takes its sub-blocks' float steps in increasing
// order. U4: a Nib (qkernels.h).
template <int U4, int SB, bool HZ, bool HM, int R>
void tile_rows(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g, int64_t m,
               const int8_t* a, const uint8_t* wpre) {
  constexpr int64_t kBytes = U4 ? 8 * SB : 16 * SB;
  constexpr int64_t kLag = 2, kRing = 4;
  const int64_t K = w.k, nsb = K / SB, nb = K / 32;
  __m512 acc[R];
#pragma GCC unroll 16
  for (int j = 0; j < R; ++j) acc[j] = _mm512_setzero_ps();
  __m512i negz = _mm512_setzero_si512();
  if constexpr (HZ) negz = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(w.zero + 16 * g));
  alignas(64) int32_t c[kRing][R][16];
  alignas(64) uint8_t stage[2][8 * 64];  // u4: a sub-block unpacked to bytes (B tile rows)
  const uint8_t* p = w.qs + g * nsb * kBytes;
  // One loop, no helper taking the accumulators' address, so that they stay in registers.
  for (int64_t i = 0; i < nsb + kLag; ++i) {
    if (i < nsb) {  // the tile product of sub-block i
      const uint8_t* src = p + i * kBytes;
      // The next group's sub-block, read from memory while these rows are multiplied
      // (past the last group a hint to nowhere: prefetches never fault).
#pragma GCC unroll 16
      for (int64_t o = 0; o < kBytes; o += 64) _mm_prefetch((const char*)(src + nsb * kBytes + o), _MM_HINT_T0);
      const int slot = int(i & 1);
      if (wpre) {
        src = wpre + i * 512;
      } else if constexpr (U4) {
        // Byte [v][r][j] holds chunk v in its low nibble and chunk v + 4 in its high one.
        uint8_t* st = stage[slot];
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          const __m512i wv = _mm512_loadu_si512(src + 64 * v);
          _mm512_store_si512(st + 64 * v, nibble_u<U4>(wv));
          _mm512_store_si512(st + 64 * (v + 4), nibble_u<U4>(_mm512_srli_epi16(wv, 4)));
        }
        src = st;
      }
      tile_product(slot, src, a + i * R * SB, SB, &c[i % kRing][0][0]);
    }
    if (i >= kLag) {  // the float steps of sub-block b = i - kLag
      const int64_t b = i - kLag;
      const __m512 S = load_scales<SB>(w, w.scale, g, b);
      __m512 Mn = _mm512_setzero_ps();
      if constexpr (HM) Mn = load_scales<SB>(w, w.mins, g, b);
#pragma GCC unroll 16
      for (int j = 0; j < R; ++j) {
        __m512i is = _mm512_load_si512(c[b % kRing][j]);
        if constexpr (HZ) is = _mm512_add_epi32(is, _mm512_mullo_epi32(negz, _mm512_set1_epi32(x.xs[(m + j) * nsb + b])));
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(x.d[(m + j) * nb + (b * SB) / 32]));
        acc[j] = _mm512_fmadd_ps(S, f, acc[j]);
        if constexpr (HM) acc[j] = _mm512_fmadd_ps(Mn, _mm512_set1_ps(x.dxs[(m + j) * nsb + b]), acc[j]);
      }
    }
  }
  const int64_t n = 16 * g, valid = w.n - n;
  const __mmask16 mk = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
#pragma GCC unroll 16
  for (int j = 0; j < R; ++j) _mm512_mask_storeu_ps(out + (m + j) * ldo + n, mk, acc[j]);
}

// tile_rows for R = 0..kTileRows (entries below 9 unused: 17 rows make two tiles of 9).
template <int U4, int SB, bool HZ, bool HM, int... R>
constexpr auto tile_table(std::integer_sequence<int, R...>) {
  using Fn = void (*)(const QW&, const QX&, float*, int64_t, int64_t, int64_t, const int8_t*, const uint8_t*);
  return std::array<Fn, sizeof...(R)>{(R < 9 ? nullptr : &tile_rows<U4, SB, HZ, HM, (R < 9 ? 9 : R)>)...};
}

// A thread's copies of the tiles' activations and of a group's unpacked u4 weights (one
// pair per thread for every instantiation; they only grow).
struct Scratch {
  std::vector<int8_t> a;   // [nt][K/SB][R][SB]
  std::vector<uint8_t> w;  // [K/SB][512]
};
Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

// All M = x.m rows (kMinRows <= M <= kMaxRows) x groups [g0, g1): the rows form nt tiles
// of R rows each (the fewest tiles of at most 16, as even as possible, so R >= 9); the
// last one starts at M - R, so where R * nt > M it repeats rows of the one before (the
// same row gives the same bits; it is stored twice). Groups outer: a group's later
// tiles find its weights in cache.
//
// Each tile's activations are first copied to [K/SB][R][SB], so tileloadd reads 512
// contiguous bytes: with the rows' own stride K, a power of two such as 4096 puts all
// 16 rows in one L1 set (before this copy, 8B-shape products of 16 rows measured 1.6x
// the VNNI time in one run). With two tiles, u4 weights are unpacked once per group.
template <int U4, int SB, bool HZ, bool HM>
void run(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  static constexpr auto table = tile_table<U4, SB, HZ, HM>(std::make_integer_sequence<int, kTileRows + 1>{});
  Scratch& sc = scratch();
  const int64_t K = w.k, nsb = K / SB, M = x.m;
  const int64_t nt = (M + kTileRows - 1) / kTileRows, r = (M + nt - 1) / nt;
  sc.a.resize(size_t(nt * K * r));
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t start = std::min(t * r, M - r);
    int8_t* at = sc.a.data() + t * K * r;
    for (int64_t j = 0; j < r; ++j) {
      const int8_t* src = x.q + (start + j) * K;
      for (int64_t b = 0; b < nsb; ++b) std::memcpy(at + (b * r + j) * SB, src + b * SB, SB);
    }
  }
  const bool pre = U4 && nt > 1;
  if (pre) sc.w.resize(size_t(nsb * 512));
  configure<SB>(int(r));
  for (int64_t g = g0; g < g1; ++g) {
    if (pre) {
      const uint8_t* src = w.qs + g * nsb * 256;
      for (int64_t b = 0; b < nsb; ++b) {
        uint8_t* st = sc.w.data() + b * 512;
        for (int v = 0; v < 4; ++v) {
          const __m512i wv = _mm512_loadu_si512(src + b * 256 + 64 * v);
          _mm512_storeu_si512(st + 64 * v, nibble_u<U4>(wv));
          _mm512_storeu_si512(st + 64 * (v + 4), nibble_u<U4>(_mm512_srli_epi16(wv, 4)));
        }
      }
    }
    for (int64_t t = 0; t < nt; ++t)
      table[size_t(r)](w, x, out, ldo, g, std::min(t * r, M - r), sc.a.data() + t * K * r,
                       pre ? sc.w.data() : nullptr);
  }
  _tile_release();  // leave no tile state in use (a thread's context switches stay cheap)
}

template <int U4, int SB>
void run_zm(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  const bool hz = w.zero != nullptr, hm = w.mins != nullptr;
  if (hz && hm) run<U4, SB, true, true>(w, x, out, ldo, g0, g1);
  else if (hz) run<U4, SB, true, false>(w, x, out, ldo, g0, g1);
  else if (hm) run<U4, SB, false, true>(w, x, out, ldo, g0, g1);
  else run<U4, SB, false, false>(w, x, out, ldo, g0, g1);
}

}  // namespace

void gemm_avx512amx(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  if (x.m < kMinRows || x.m > kMaxRows) {
    gemm_avx512vnni(w, x, out, ldo, g0, g1);
    return;
  }
  if (w.u4 && w.lut) run_zm<kNibCodes, 32>(w, x, out, ldo, g0, g1);
  else if (w.u4) run_zm<kNibU, 32>(w, x, out, ldo, g0, g1);
  else if (w.sb == 32) run_zm<kNoNib, 32>(w, x, out, ldo, g0, g1);
  else run_zm<kNoNib, 16>(w, x, out, ldo, g0, g1);
}

}  // namespace qk
#else
namespace qk {
// A compiler without AMX: never called (cpu_has_isa(kAvx512Amx) is false without
// RS_HAVE_AMX); the VNNI product keeps the symbol meaningful all the same.
void gemm_avx512amx(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  gemm_avx512vnni(w, x, out, ldo, g0, g1);
}
}  // namespace qk
#endif
