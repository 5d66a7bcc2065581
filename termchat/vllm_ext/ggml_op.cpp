// termchat_ggml: a GGUF file's own blocks as weights in vLLM, multiplied by ggml's CPU kernels.
//
// pack() hands one linear layer's blocks (one or more shards of one ggml type) to ggml's
// CPU backend, in the buffer ggml itself would choose for them: AMX or CPU_REPACK where
// the CPU and the type allow it (the kernels llama.cpp runs), its plain buffer otherwise.
// linear() multiplies by ggml's own mul_mat: the activations quantized once to the
// type's vec_dot_type, then ggml's kernels over the weight rows. ggml is built with
// OpenMP and linked to torch's own libgomp, so its threads are torch's threads: one
// team, never a second pool. get_rows() dequantizes embedding rows (ggml's to_float).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>  // the few-rows kernel
#endif
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-backend.h"

namespace {

struct Packed {
  ggml_context* ctx = nullptr;          // holds the tensor's header
  ggml_backend_buffer_t buf = nullptr;  // holds its blocks, repacked where ggml repacks
  ggml_tensor* t = nullptr;
  bool amx = false;                     // in ggml's AMX buffer: tiles of 16 rows x one block
  bool tiles = false;                   // Q4_1 in that tile layout (Q8_0 in one like it), written by termchat in a plain buffer (no AMX):
                                        // only the few-rows kernel reads it, at every row count
  bool repack = false;                  // in ggml's CPU_REPACK buffer: several rows go through its gemm
};

std::mutex registry_mutex;
std::unordered_map<const void*, Packed*> registry;  // a handle's data pointer -> its ggml tensor

void errors_only(enum ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

void init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    ggml_log_set(errors_only, nullptr);  // not a line per repacked tensor
    ggml_cpu_init();
  });
}

ggml_backend_dev_t cpu_device() { return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); }

// the buffer types ggml's CPU backend offers weights, in its order (AMX, CPU_REPACK), then the plain one
std::vector<ggml_backend_buffer_type_t> buffer_types(bool extra) {
  std::vector<ggml_backend_buffer_type_t> out;
  if (extra) {
    ggml_backend_dev_t dev = cpu_device();
    auto get = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    if (get)
      for (auto* p = get(dev); p && *p; ++p) out.push_back(*p);
  }
  out.push_back(ggml_backend_cpu_buffer_type());
  return out;
}

// would ggml multiply a weight of this type and shape held in `buft`? (llama.cpp's weight_buft_supported)
bool supports(ggml_backend_buffer_type_t buft, ggml_type type, int64_t k, int64_t rows) {
  if (buft == ggml_backend_cpu_buffer_type()) return true;
  ggml_init_params params{ggml_tensor_overhead() * 4, nullptr, true};
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* w = ggml_new_tensor_2d(ctx, type, k, rows);
  ggml_tensor* op = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, 512));
  w->buffer = ggml_backend_buft_alloc_buffer(buft, 0);
  bool ok = ggml_backend_dev_supports_op(cpu_device(), op);
  ggml_backend_buffer_free(w->buffer);
  ggml_free(ctx);
  return ok;
}

Packed* lookup(const at::Tensor& handle) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry.find(handle.data_ptr());
  TORCH_CHECK(it != registry.end(), "termchat_ggml: this tensor is not a weight made by termchat_ggml::pack (copied?)");
  return it->second;
}

ggml_threadpool* threadpool(int threads) {
  static std::mutex mutex;
  static std::unordered_map<int, ggml_threadpool*> pools;  // with OpenMP only state: the threads are OpenMP's
  std::lock_guard<std::mutex> lock(mutex);
  auto& pool = pools[threads];
  if (!pool) {
    ggml_threadpool_params params = ggml_threadpool_params_default(threads);
    pool = ggml_threadpool_new(&params);
  }
  return pool;
}

// A built ggml graph for one layer's product at one number of rows: decode and draft
// verification repeat the same few shapes, so each call only points it at its input and
// output (building and planning it every call cost about 2 us of a 9 us call). A cached
// plan owns no scratch: its quantized activation rows go in the calling thread's one
// buffer, since a plan of its own for each of up to 64 row counts of every layer grew a 7B
// engine by 40-50 MB with each prompt of a new length (bench README)
struct Plan {
  std::vector<uint8_t> meta;
  ggml_context* ctx = nullptr;
  ggml_cgraph* graph = nullptr;
  ggml_tensor* src = nullptr;
  std::vector<ggml_tensor*> nodes;
  std::vector<int64_t> cols;
  std::vector<uint8_t> work;
  ggml_cplan plan{};
  ~Plan() { if (ctx) ggml_free(ctx); }
};

constexpr int64_t CACHED_ROWS = 64;        // prefill's longer shapes are built per call
std::atomic<uint64_t> generation{0};       // a weight freed: every cached plan may point at it

bool few_rows_enabled() {  // TERMCHAT_GGML_FEW_ROWS=0: ggml's own path for every row count (for measuring)
  static const bool on = [] { const char* v = getenv("TERMCHAT_GGML_FEW_ROWS"); return !(v && strcmp(v, "0") == 0); }();
  return on;
}

std::unique_ptr<Plan> build_plan(const std::vector<Packed*>& packed, const std::vector<int64_t>& cols, int64_t m, int64_t n_total, int threads, bool own_work) {
  auto plan = std::make_unique<Plan>();
  plan->meta.resize(ggml_tensor_overhead() * (packed.size() + 2) + ggml_graph_overhead_custom(16, false));
  ggml_init_params params{plan->meta.size(), plan->meta.data(), true};
  plan->ctx = ggml_init(params);
  const int64_t k = packed[0]->t->ne[0];
  plan->src = ggml_new_tensor_2d(plan->ctx, GGML_TYPE_F32, k, m);
  plan->graph = ggml_new_graph_custom(plan->ctx, 16, false);
  for (size_t i = 0; i < packed.size(); i++) {
    ggml_tensor* node = ggml_mul_mat(plan->ctx, packed[i]->t, plan->src);
    node->nb[1] = n_total * sizeof(float);  // its own columns of the output
    node->nb[2] = node->nb[3] = node->nb[1] * m;
    plan->nodes.push_back(node);
    plan->cols.push_back(cols[i]);
    ggml_build_forward_expand(plan->graph, node);
  }
  plan->plan = ggml_graph_plan(plan->graph, threads, threadpool(threads));
  if (own_work) {
    plan->work.resize(plan->plan.work_size);
    plan->plan.work_data = plan->work.data();
  }
  return plan;
}


// A few rows (draft verification: 2-8) against Q4_1 weights in ggml's AMX buffer. ggml runs
// one row on AVX512-VNNI (tinygemm_kernel_vnni, M = 1) and more rows on AMX tiles of 32
// rows, which first unpacks every weight tile to int8: 2 rows cost 1.8x one, 4 rows 1.9x,
// 17 rows 3.6x (bench README). Here each weight tile is read once and unpacked once, then
// multiplied by every row with the M = 1 kernel's own instructions in its own order, so each
// row comes out to the bit as it would alone: a verification step computes what a plain step
// would. ggml's packed layout (amx/mmq.cpp): tile (n, k) of 16 rows x 32 values at
// (n * KB + k) * 320 bytes, 256 bytes of nibbles, then 16 scales d, then 16 mins m (fp16).
//
// On AVX512-VNNI without AMX (AMD's Zen 4 and 5), ggml keeps Q4_1 in its plain buffer and
// multiplies with its AVX2 dot product, one activation row at a time: 2 rows cost 1.97x one,
// 4 rows 3.1x, 17 rows 10.4x (bench README), so every draft a verification carries costs
// almost a plain step. There pack() writes the same tile layout itself (tile_q4_1) and this
// kernel runs every row count, one row included, in chunks of up to 8 rows: each row comes
// out to the bit as alone there too.
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
constexpr int64_t Q4_1_TILE = 16 * 20;  // ggml's AMX tile of Q4_1: 16 rows x one block of 20 bytes
constexpr int64_t Q8_0_TILE = 16 * 32 + 16 * 2 + 16 * 4;  // termchat's Q8_0 tile: values, scales, sums x 128
constexpr int64_t FEW_ROWS = 8;  // measured: 9-16 rows gain little over AMX tiles (bench README); the registers hold 8 rows
struct BlockQ8_1 { ggml_fp16_t d, s; int8_t qs[32]; };  // ggml's block_q8_1
static_assert(sizeof(BlockQ8_1) == 36, "block_q8_1 is 36 bytes");

template <int M>
void q4_1_few_rows_tile(const BlockQ8_1* a, const float* ds, int64_t kb, const uint8_t* tiles, float* out, int64_t ldo) {
  const __m512i low = _mm512_set1_epi8(0xF);
  __m512 vc[M];
  #pragma GCC unroll 8
  for (int r = 0; r < M; r++) vc[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < kb; i++) {
    const uint8_t* b = tiles + i * Q4_1_TILE;
    __m512i vb[8];
    #pragma GCC unroll 8
    for (int k = 0; k < 8; k += 2) {
      const __m512i bytes = _mm512_loadu_si512((const __m512i*)(b + k * 32));
      vb[k] = _mm512_and_si512(bytes, low);
      vb[k + 1] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
    }
    const __m512 vd0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(b + 256)));
    const __m512 vm0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(b + 256 + 32)));
    // the rows' integer sums side by side, so their dpbusd chains overlap (integer sums are
    // exact in any order); the float steps then as ggml's, row by row
    __m512i vsum[M];
    #pragma GCC unroll 8
    for (int r = 0; r < M; r++) vsum[r] = _mm512_setzero_si512();
    #pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
      #pragma GCC unroll 8
      for (int r = 0; r < M; r++)
        vsum[r] = _mm512_dpbusd_epi32(vsum[r], vb[k], _mm512_set1_epi32(reinterpret_cast<const int32_t*>(a[r * kb + i].qs)[k]));
    #pragma GCC unroll 8
    for (int r = 0; r < M; r++) {
      const __m512 vd1 = _mm512_set1_ps(ds[2 * (r * kb + i)]);
      const __m512 vs1 = _mm512_set1_ps(ds[2 * (r * kb + i) + 1]);
      vc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(vsum[r]), _mm512_mul_ps(vd0, vd1), vc[r]);
      vc[r] = _mm512_fmadd_ps(vm0, vs1, vc[r]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < M; r++) _mm512_storeu_ps(out + r * ldo, vc[r]);
}

bool tileable(ggml_type type, int64_t k, int64_t rows) { return (type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q8_0) && rows % 16 == 0 && k % 32 == 0; }

// bytes a tile (16 rows x one block of 32 values) takes in termchat's layout
int64_t tile_bytes(ggml_type type) { return type == GGML_TYPE_Q8_0 ? Q8_0_TILE : Q4_1_TILE; }

// GGUF's Q4_1 blocks (fp16 d, fp16 m, 16 bytes: value i in the low nibble of byte i, value
// i + 16 in its high nibble), rows [rows, k], into the tile layout the kernel reads: in tile
// (n, i), byte 32 * c + 4 * j + t (c = 0, 2, 4, 6) holds row 16n + j's value 4c + t in its
// low nibble and value 4c + 4 + t in its high one
void tile_q4_1(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t k) {
  const int64_t kb = k / 32, row_bytes = kb * 20;
  at::parallel_for(0, rows / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; n++)
      for (int64_t i = 0; i < kb; i++) {
        uint8_t* t = dst + (n * kb + i) * Q4_1_TILE;
        for (int64_t j = 0; j < 16; j++) {
          const uint8_t* b = src + (n * 16 + j) * row_bytes + i * 20;
          uint8_t v[32];
          for (int q = 0; q < 16; q++) {
            v[q] = b[4 + q] & 0xF;
            v[q + 16] = b[4 + q] >> 4;
          }
          for (int c = 0; c < 8; c += 2)
            for (int u = 0; u < 4; u++) t[32 * c + 4 * j + u] = (uint8_t)(v[4 * c + u] | (v[4 * c + 4 + u] << 4));
          memcpy(t + 256 + 2 * j, b, 2);      // d
          memcpy(t + 288 + 2 * j, b + 2, 2);  // m
        }
      }
  });
}

// GGUF's Q8_0 blocks (fp16 d, 32 int8 values) into tiles for dpbusd, which multiplies
// unsigned by signed bytes: the activations go in shifted by 128 (as uint8), so each tile
// carries 128 x its rows' block sums to take back. Tile (n, i), 608 bytes: byte 64 * c + 4 * j
// + t holds row 16n + j's value 4c + t (c = 0..7); then 16 scales d (fp16); then 16 int32
// sums x 128
void tile_q8_0(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t k) {
  const int64_t kb = k / 32, row_bytes = kb * 34;
  at::parallel_for(0, rows / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; n++)
      for (int64_t i = 0; i < kb; i++) {
        uint8_t* t = dst + (n * kb + i) * Q8_0_TILE;
        for (int64_t j = 0; j < 16; j++) {
          const uint8_t* b = src + (n * 16 + j) * row_bytes + i * 34;
          const int8_t* v = reinterpret_cast<const int8_t*>(b + 2);
          int32_t sum = 0;
          for (int c = 0; c < 8; c++)
            for (int u = 0; u < 4; u++) {
              t[64 * c + 4 * j + u] = static_cast<uint8_t>(v[4 * c + u]);
              sum += v[4 * c + u];
            }
          memcpy(t + 512 + 2 * j, b, 2);  // d
          const int32_t taken = 128 * sum;
          memcpy(t + 544 + 4 * j, &taken, 4);
        }
      }
  });
}

struct BlockQ8_0 { ggml_fp16_t d; int8_t qs[32]; };  // ggml's block_q8_0
static_assert(sizeof(BlockQ8_0) == 34, "block_q8_0 is 34 bytes");

// M rows of activations (blocks shifted to uint8, scales as float) times 16 weight rows
template <int M>
void q8_0_few_rows_tile(const uint8_t* a, const float* da, int64_t kb, const uint8_t* tiles, float* out, int64_t ldo) {
  __m512 vc[M];
  #pragma GCC unroll 8
  for (int r = 0; r < M; r++) vc[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < kb; i++) {
    const uint8_t* b = tiles + i * Q8_0_TILE;
    __m512i vb[8];
    #pragma GCC unroll 8
    for (int c = 0; c < 8; c++) vb[c] = _mm512_loadu_si512((const __m512i*)(b + 64 * c));
    const __m512 vd0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(b + 512)));
    const __m512i taken = _mm512_loadu_si512((const __m512i*)(b + 544));
    __m512i vsum[M];
    #pragma GCC unroll 8
    for (int r = 0; r < M; r++) vsum[r] = _mm512_setzero_si512();
    #pragma GCC unroll 8
    for (int c = 0; c < 8; c++)
      #pragma GCC unroll 8
      for (int r = 0; r < M; r++)
        vsum[r] = _mm512_dpbusd_epi32(vsum[r], _mm512_set1_epi32(reinterpret_cast<const int32_t*>(a + (r * kb + i) * 32)[c]), vb[c]);
    #pragma GCC unroll 8
    for (int r = 0; r < M; r++) {
      const __m512i exact = _mm512_sub_epi32(vsum[r], taken);  // the signed dot product, exact
      vc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(vd0, _mm512_set1_ps(da[r * kb + i])), vc[r]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < M; r++) _mm512_storeu_ps(out + r * ldo, vc[r]);
}

bool few_rows_apply(const Packed* p, int64_t m) {
  return p->tiles || (p->amx && p->t->type == GGML_TYPE_Q4_1 && tileable(p->t->type, p->t->ne[0], p->t->ne[1]) && m >= 2 && m <= FEW_ROWS);
}

// the activations as each weight type's kernel takes them, quantized once per call
struct Activations {
  const BlockQ8_1* q8_1 = nullptr;  // Q4_1's: ggml's quantize_row_q8_1, as its AMX path
  const float* ds = nullptr;        // their scales and sums as float, converted once (not per weight tile)
  const uint8_t* q8_0 = nullptr;    // Q8_0's: ggml's quantize_row_q8_0, shifted by 128 to uint8
  const float* d = nullptr;         // their scales as float
};

template <int M>
void tile_rows(ggml_type type, const Activations& a, int64_t r, int64_t kb, const uint8_t* t, float* o, int64_t ldo) {
  if (type == GGML_TYPE_Q8_0)
    q8_0_few_rows_tile<M>(a.q8_0 + r * kb * 32, a.d + r * kb, kb, t, o, ldo);
  else
    q4_1_few_rows_tile<M>(a.q8_1 + r * kb, a.ds + 2 * r * kb, kb, t, o, ldo);
}

// rows [m, k] times each weight, side by side in out [m, n_total]; false if this path does not apply
bool few_rows(const std::vector<Packed*>& packed, const float* x, int64_t m, float* out, int64_t n_total) {
  for (auto* p : packed)
    if (!few_rows_apply(p, m)) return false;
  const int64_t k = packed[0]->t->ne[0], kb = k / 32;
  Activations act;  // its arrays are this thread's: the team's threads get the pointers, not their own
  if (std::any_of(packed.begin(), packed.end(), [](Packed* p) { return p->t->type == GGML_TYPE_Q4_1; })) {
    thread_local std::vector<BlockQ8_1> a;
    thread_local std::vector<float> ds;
    a.resize(m * kb);
    ds.resize(2 * m * kb);
    const auto from_float = ggml_get_type_traits_cpu(GGML_TYPE_Q8_1)->from_float;
    for (int64_t r = 0; r < m; r++) from_float(x + r * k, a.data() + r * kb, k);
    for (int64_t j = 0; j < m * kb; j++) {
      ds[2 * j] = ggml_fp16_to_fp32(a[j].d);
      ds[2 * j + 1] = ggml_fp16_to_fp32(a[j].s);
    }
    act.q8_1 = a.data();
    act.ds = ds.data();
  }
  if (std::any_of(packed.begin(), packed.end(), [](Packed* p) { return p->t->type == GGML_TYPE_Q8_0; })) {
    thread_local std::vector<BlockQ8_0> blocks;
    thread_local std::vector<uint8_t> shifted;
    thread_local std::vector<float> d;
    blocks.resize(m * kb);
    shifted.resize(m * kb * 32);
    d.resize(m * kb);
    const auto from_float = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
    for (int64_t r = 0; r < m; r++) from_float(x + r * k, blocks.data() + r * kb, k);
    for (int64_t j = 0; j < m * kb; j++) {
      d[j] = ggml_fp16_to_fp32(blocks[j].d);
      for (int q = 0; q < 32; q++) shifted[j * 32 + q] = static_cast<uint8_t>(blocks[j].qs[q] + 128);
    }
    act.q8_0 = shifted.data();
    act.d = d.data();
  }
  int64_t col = 0;
  for (auto* p : packed) {
    const int64_t tiles = p->t->ne[1] / 16;
    const ggml_type type = p->t->type;
    const int64_t bytes = tile_bytes(type);
    const uint8_t* base = static_cast<const uint8_t*>(p->t->data);
    float* dst = out + col;
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; n++) {
        const uint8_t* t = base + n * kb * bytes;
        for (int64_t r = 0; r < m; r += FEW_ROWS) {  // chunks of up to 8 rows: the tile stays in cache between them
          float* o = dst + r * n_total + n * 16;
          switch (std::min<int64_t>(m - r, FEW_ROWS)) {
            case 1: tile_rows<1>(type, act, r, kb, t, o, n_total); break;
            case 2: tile_rows<2>(type, act, r, kb, t, o, n_total); break;
            case 3: tile_rows<3>(type, act, r, kb, t, o, n_total); break;
            case 4: tile_rows<4>(type, act, r, kb, t, o, n_total); break;
            case 5: tile_rows<5>(type, act, r, kb, t, o, n_total); break;
            case 6: tile_rows<6>(type, act, r, kb, t, o, n_total); break;
            case 7: tile_rows<7>(type, act, r, kb, t, o, n_total); break;
            default: tile_rows<8>(type, act, r, kb, t, o, n_total); break;
          }
        }
      }
    });
    col += p->t->ne[1];
  }
  return true;
}
#else
bool tileable(ggml_type, int64_t, int64_t) { return false; }  // the kernel needs AVX512-VNNI
int64_t tile_bytes(ggml_type) { return 0; }
void tile_q4_1(const uint8_t*, uint8_t*, int64_t, int64_t) {}
void tile_q8_0(const uint8_t*, uint8_t*, int64_t, int64_t) {}
bool few_rows(const std::vector<Packed*>&, const float*, int64_t, float*, int64_t) { return false; }  // no AMX buffer without AVX-512
#endif

}  // namespace

// rows of GGUF blocks, uint8 [rows, row_bytes] per shard (one ggml type, stacked in order)
// -> a handle, uint8 [rows, bytes a row takes in ggml's buffer], over ggml's own memory
at::Tensor pack(std::vector<at::Tensor> shards, int64_t type, int64_t k, bool extra) {
  init_once();
  TORCH_CHECK(type >= 0 && type < GGML_TYPE_COUNT && ggml_get_type_traits_cpu((ggml_type)type)->vec_dot, "termchat_ggml: ggml type ", type, " has no CPU kernel");
  const ggml_type gtype = (ggml_type)type;
  TORCH_CHECK(k > 0 && k % ggml_blck_size(gtype) == 0, "termchat_ggml: a row of ", k, " values is not whole ", ggml_type_name(gtype), " blocks");
  const size_t row_bytes = ggml_row_size(gtype, k);
  int64_t rows = 0;
  for (auto& s : shards) {
    TORCH_CHECK(s.scalar_type() == at::kByte && s.dim() == 2 && s.is_contiguous() && (size_t)s.size(1) == row_bytes,
                "termchat_ggml: a shard must be contiguous uint8 [rows, ", row_bytes, "]");
    rows += s.size(0);
  }
  TORCH_CHECK(rows > 0, "termchat_ggml: no rows");
  std::vector<uint8_t> joined;  // ggml repacks whole tensors only
  const void* data = shards.size() == 1 ? shards[0].data_ptr() : nullptr;
  if (!data) {
    joined.resize(rows * row_bytes);
    size_t at = 0;
    for (auto& s : shards) {
      memcpy(joined.data() + at, s.data_ptr(), s.numel());
      at += s.numel();
    }
    data = joined.data();
  }
  auto* p = new Packed();
  ggml_init_params params{ggml_tensor_overhead(), nullptr, true};
  p->ctx = ggml_init(params);
  p->t = ggml_new_tensor_2d(p->ctx, gtype, k, rows);
  for (auto buft : buffer_types(extra)) {
    if (!supports(buft, gtype, k, rows)) continue;
    p->tiles = extra && buft == ggml_backend_cpu_buffer_type() && few_rows_enabled() && tileable(gtype, k, rows);
    // Q8_0's tiles carry their block sums too: more bytes than the blocks
    const size_t size = p->tiles ? (size_t)(rows / 16) * (k / 32) * tile_bytes(gtype) : ggml_backend_buft_get_alloc_size(buft, p->t);
    p->buf = ggml_backend_buft_alloc_buffer(buft, size);
    TORCH_CHECK(p->buf, "termchat_ggml: could not allocate ", size, " bytes for a weight");
    ggml_backend_buffer_set_usage(p->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_backend_tensor_alloc(p->buf, p->t, ggml_backend_buffer_get_base(p->buf));
    // no AMX: Q4_1 and Q8_0 in termchat's tile layout, for the few-rows kernels at every row count
    if (p->tiles && gtype == GGML_TYPE_Q8_0)
      tile_q8_0(static_cast<const uint8_t*>(data), static_cast<uint8_t*>(p->t->data), rows, k);
    else if (p->tiles)
      tile_q4_1(static_cast<const uint8_t*>(data), static_cast<uint8_t*>(p->t->data), rows, k);
    else
      ggml_backend_tensor_set(p->t, data, 0, rows * row_bytes);
    break;
  }
  p->amx = strcmp(ggml_backend_buffer_name(p->buf), "AMX") == 0;
  p->repack = strcmp(ggml_backend_buffer_name(p->buf), "CPU_REPACK") == 0;
  const size_t held = ggml_backend_buffer_get_size(p->buf);
  const int64_t width = held % rows == 0 ? (int64_t)(held / rows) : 1;
  auto release = [p](void*) {
    {
      std::lock_guard<std::mutex> lock(registry_mutex);
      registry.erase(p->t->data);
    }
    generation++;
    ggml_backend_buffer_free(p->buf);
    ggml_free(p->ctx);
    delete p;
  };
  at::Tensor handle = at::from_blob(p->t->data, {rows, width}, release, at::TensorOptions().dtype(at::kByte));
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry[p->t->data] = p;
  return handle;
}

std::string buffer_name(const at::Tensor& handle) {
  Packed* p = lookup(handle);
  return p->tiles ? std::string("CPU (termchat's ") + ggml_type_name(p->t->type) + " tiles)" : ggml_backend_buffer_name(p->buf);
}

// x [..., k] times each handle's weight, transposed, side by side: [..., sum of their rows]
at::Tensor ggml_linear(const at::Tensor& x, std::vector<at::Tensor> weights) {
  TORCH_CHECK(!weights.empty(), "termchat_ggml::linear: no weights");
  std::vector<Packed*> packed;
  int64_t n_total = 0;
  for (auto& w : weights) {
    packed.push_back(lookup(w));
    n_total += packed.back()->t->ne[1];
  }
  const int64_t k = packed[0]->t->ne[0];
  TORCH_CHECK(x.size(-1) == k, "termchat_ggml::linear: rows of ", x.size(-1), " values, the weight takes ", k);
  // the usual case, float32 rows in one piece, costs no torch op at all
  const bool ready = x.scalar_type() == at::kFloat && x.is_contiguous();
  at::Tensor rows = ready ? x : x.to(at::kFloat).contiguous();
  const int64_t m = k ? rows.numel() / k : 0;
  auto shape = x.sizes().vec();
  shape.back() = n_total;
  at::Tensor out = at::empty(shape, rows.options());
  std::vector<int64_t> cols;
  for (size_t i = 0, col = 0; i < packed.size(); col += packed[i]->t->ne[1], i++) cols.push_back(col);
  bool done = m == 0 || (few_rows_enabled() && few_rows(packed, rows.data_ptr<float>(), m, out.data_ptr<float>(), n_total));
  if (!done && std::any_of(packed.begin(), packed.end(), [](Packed* p) { return p->tiles; })) {
    // a layer whose weights differ in type: the tiled ones here, the rest through ggml below
    std::vector<Packed*> rest;
    std::vector<int64_t> rest_cols;
    for (size_t i = 0; i < packed.size(); i++) {
      if (packed[i]->tiles) {
        TORCH_CHECK(few_rows({packed[i]}, rows.data_ptr<float>(), m, out.data_ptr<float>() + cols[i], n_total), "termchat_ggml: a tiled weight's kernel did not run");
      } else {
        rest.push_back(packed[i]);
        rest_cols.push_back(cols[i]);
      }
    }
    packed.swap(rest);
    cols.swap(rest_cols);
  }
  if (!done) {
    const int threads = std::max(1, at::get_num_threads());
    thread_local std::unordered_map<std::string, std::unique_ptr<Plan>> plans;
    thread_local uint64_t seen = 0;
    thread_local std::vector<uint8_t> scratch;  // every cached plan's work data: one call at a time per thread
    if (seen != generation.load()) {
      plans.clear();
      seen = generation.load();
    }
    auto compute = [&](const float* src, float* dst, int64_t mm) {
      std::unique_ptr<Plan> once;
      Plan* plan;
      if (mm <= CACHED_ROWS) {
        std::string key(reinterpret_cast<const char*>(packed.data()), packed.size() * sizeof(Packed*));
        key.append(reinterpret_cast<const char*>(&mm), sizeof mm).append(reinterpret_cast<const char*>(&threads), sizeof threads);
        key.append(reinterpret_cast<const char*>(&n_total), sizeof n_total);  // a layer's weights without its tiled ones: their columns
        key.append(reinterpret_cast<const char*>(cols.data()), cols.size() * sizeof(int64_t));
        auto& cached = plans[key];
        if (!cached) cached = build_plan(packed, cols, mm, n_total, threads, false);
        plan = cached.get();
        if (scratch.size() < plan->plan.work_size) scratch.resize(plan->plan.work_size);
        plan->plan.work_data = scratch.data();
      } else {
        once = build_plan(packed, cols, mm, n_total, threads, true);
        plan = once.get();
      }
      plan->src->data = const_cast<float*>(src);
      for (size_t i = 0; i < plan->nodes.size(); i++) plan->nodes[i]->data = dst + plan->cols[i];
      const ggml_status status = ggml_graph_compute(plan->graph, &plan->plan);
      TORCH_CHECK(status == GGML_STATUS_SUCCESS, "termchat_ggml::linear: ggml's compute failed (", (int)status, ")");
    };
    // Outside ggml's AMX buffer, several rows may take another path than one: CPU_REPACK's gemm
    // over groups of 4 rows (Q4_K) and the plain buffer's multi-row kernels (Q6_K) sum in
    // another order than the one-row kernel, so a row verified beside drafts came out other
    // bits than alone (AVX-512 without AMX, at 8 rows). Decode and verification row counts
    // run row by row there; prefill keeps ggml's way. Q4_1 and Q8_0 in the plain buffer (AVX2
    // machines: the default's types) came out the same at every row count (test_ggml), and
    // keep ggml's rows together, which read each weight once.
    auto same_bits = [](Packed* p) {
      return p->amx || (!p->repack && (p->t->type == GGML_TYPE_Q4_1 || p->t->type == GGML_TYPE_Q8_0));
    };
    const bool per_row = m > 1 && m <= CACHED_ROWS && !std::all_of(packed.begin(), packed.end(), same_bits);
    const float* src = rows.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    if (per_row)
      for (int64_t r = 0; r < m; r++) compute(src + r * k, dst + r * n_total, 1);
    else
      compute(src, dst, m);
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// one weight (a layer of one type, the usual case): no list to box at every call
at::Tensor ggml_linear1(const at::Tensor& x, const at::Tensor& weight) { return ggml_linear(x, std::vector<at::Tensor>{weight}); }

// shapes for torch.compile: symbolic sizes, so the number of tokens stays dynamic
// ggml's own way, for measuring: every product xs[i] @ weights[i].T as one graph, computed in
// one call (bench.kernels compares linear()'s one call per layer with it)
std::vector<at::Tensor> graph(std::vector<at::Tensor> xs, std::vector<at::Tensor> weights) {
  TORCH_CHECK(xs.size() == weights.size() && !xs.empty(), "termchat_ggml::graph: as many inputs as weights");
  const size_t n = xs.size();
  std::vector<uint8_t> meta(ggml_tensor_overhead() * (2 * n + 2) + ggml_graph_overhead_custom(2 * n + 16, false));
  ggml_init_params params{meta.size(), meta.data(), true};
  ggml_context* ctx = ggml_init(params);
  ggml_cgraph* g = ggml_new_graph_custom(ctx, 2 * n + 16, false);
  std::vector<at::Tensor> rows, outs;
  for (size_t i = 0; i < n; i++) {
    Packed* p = lookup(weights[i]);
    TORCH_CHECK(!p->tiles, "termchat_ggml::graph: this weight is in termchat's tile layout, which ggml cannot read (pack it with extra=false)");
    rows.push_back(xs[i].reshape({-1, p->t->ne[0]}).to(at::kFloat).contiguous());
    outs.push_back(at::empty({rows[i].size(0), p->t->ne[1]}, rows[i].options()));
    ggml_tensor* src = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, p->t->ne[0], rows[i].size(0));
    src->data = rows[i].data_ptr();
    ggml_tensor* node = ggml_mul_mat(ctx, p->t, src);
    node->data = outs[i].data_ptr();
    ggml_build_forward_expand(g, node);
  }
  const int threads = std::max(1, at::get_num_threads());
  ggml_cplan plan = ggml_graph_plan(g, threads, threadpool(threads));
  std::vector<uint8_t> work(plan.work_size);
  plan.work_data = work.data();
  const ggml_status status = ggml_graph_compute(g, &plan);
  ggml_free(ctx);
  TORCH_CHECK(status == GGML_STATUS_SUCCESS, "termchat_ggml::graph: ggml's compute failed");
  return outs;
}

at::Tensor linear_meta(const at::Tensor& x, std::vector<at::Tensor> weights) {
  c10::SymInt n_total = 0;
  for (auto& w : weights) n_total += w.sym_size(0);
  auto shape = x.sym_sizes().vec();
  shape.back() = n_total;
  return at::empty_symint(shape, x.options());
}

// rows `ids` of a weight kept as its GGUF blocks (uint8 [rows, row_bytes], not packed): float32 [..., k]
at::Tensor get_rows(const at::Tensor& raw, const at::Tensor& ids, int64_t type, int64_t k) {
  init_once();
  TORCH_CHECK(type >= 0 && type < GGML_TYPE_COUNT, "termchat_ggml::get_rows: unknown type ", type);
  const ggml_type gtype = (ggml_type)type;
  const auto* traits = ggml_get_type_traits(gtype);
  TORCH_CHECK(traits->to_float, "termchat_ggml: no dequantizer for ", ggml_type_name(gtype));
  const size_t row_bytes = ggml_row_size(gtype, k);
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 2 && raw.is_contiguous() && (size_t)raw.size(1) == row_bytes, "termchat_ggml::get_rows: the weight must be uint8 [rows, ", row_bytes, "]");
  at::Tensor flat = ids.reshape({-1}).to(at::kLong).contiguous();
  const int64_t n = flat.size(0), vocab = raw.size(0);
  at::Tensor out = at::empty({n, k}, at::TensorOptions().dtype(at::kFloat));
  const int64_t* id = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; i++) TORCH_CHECK(id[i] >= 0 && id[i] < vocab, "termchat_ggml::get_rows: row ", id[i], " of ", vocab);
  const uint8_t* base = raw.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) traits->to_float(base + id[i] * row_bytes, dst + i * k, k);
  });
  auto shape = ids.sizes().vec();
  shape.push_back(k);
  return out.view(shape);
}

at::Tensor linear1_meta(const at::Tensor& x, const at::Tensor& weight) {
  auto shape = x.sym_sizes().vec();
  shape.back() = weight.sym_size(0);
  return at::empty_symint(shape, x.options());
}

at::Tensor get_rows_meta(const at::Tensor& raw, const at::Tensor& ids, int64_t type, int64_t k) {
  auto shape = ids.sym_sizes().vec();
  shape.push_back(c10::SymInt(k));
  return at::empty_symint(shape, ids.options().dtype(at::kFloat));
}

TORCH_LIBRARY(termchat_ggml, m) {
  m.def("pack(Tensor[] shards, int type, int k, bool extra) -> Tensor");
  m.def("linear(Tensor x, Tensor[] weights) -> Tensor");
  m.def("linear1(Tensor x, Tensor weight) -> Tensor");
  m.def("get_rows(Tensor raw, Tensor ids, int type, int k) -> Tensor");
  m.def("buffer_name(Tensor handle) -> str");
  m.def("graph(Tensor[] xs, Tensor[] weights) -> Tensor[]");
}
TORCH_LIBRARY_IMPL(termchat_ggml, CPU, m) {
  m.impl("pack", pack);
  m.impl("linear", ggml_linear);
  m.impl("linear1", ggml_linear1);
  m.impl("get_rows", get_rows);
  m.impl("buffer_name", buffer_name);
  m.impl("graph", graph);
}
TORCH_LIBRARY_IMPL(termchat_ggml, Meta, m) {
  m.impl("linear", linear_meta);
  m.impl("linear1", linear1_meta);
  m.impl("get_rows", get_rows_meta);
}
