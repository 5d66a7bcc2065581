// termchat_attn: a layer's attention as one C++ call, with no Python in it.
//
// vLLM's CPU attention is two Python custom ops per layer (unified_kv_cache_update,
// unified_attention_with_output): each looks up the forward context, the layer and its
// metadata in Python, then calls a C++ kernel through a Python wrapper. At batch 1 that
// Python costs more than the kernels (bench README, "One attention call per layer").
// attend() does the same two kernel calls, vLLM's own (_C::cpu_attn_reshape_and_cache,
// _C::cpu_attention_with_kv_cache, called through torch's dispatcher), with what stays
// fixed for a layer registered once (its KV cache, scale, ISA) and a step's metadata set
// once per step for its KV-cache group (attention.py does both from Python).
//
// For a float32 layer with no window, soft cap or scaled cache (the default's, and a GGUF
// file's), attend() runs the rows after each prompt on termchat's own kernel (own_attention
// below; a prompt's rows keep vLLM's kernel): vLLM's, with
// its KV split off (as row invariance needs), gives one thread per KV head, so 3 heads
// share 2 cores unevenly, and it spent 17 us a layer on 300 tokens of context. termchat's
// splits every row's context at fixed 64-token boundaries and merges the parts in order:
// the same sums for a row whatever else the step holds, on any number of threads.
//
// One thread runs a model's forward, so the state here is not locked.
#if defined(__AVX512F__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__)
#define CPU_CAPABILITY_AVX2
#endif
#define CPU_CAPABILITY termchat_attn_isa  // a namespace of its own: torch's kernels keep theirs
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Layer {
  bool set = false;
  int64_t group = 0;
  at::Tensor key_cache, value_cache;  // views of the layer's KV cache, as vLLM's forward makes them
  std::string isa, kv_cache_dtype;
  double scale = 1, softcap = 0, k_scale = 1, v_scale = 1;
  int64_t sliding_window = -1;
  bool own = false;  // own_attention() runs it (set_layer's caller checked the layer; attend() checks the step)
};

struct Step {
  bool live = false;  // set by the group's metadata build, cleared after the forward
  int64_t tokens = 0;
  at::Tensor query_start_loc, seq_lens, block_table, slot_mapping, scheduler_metadata;
  bool causal = true;
  c10::optional<at::Tensor> dynamic_causal;
};

std::vector<Layer> layers;
std::vector<Step> steps;
at::Tensor prompts;  // int32 [requests]: each request's prompt length, in the steps' request order (set_prompts), or undefined

c10::OperatorHandle vllm_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

template <class T>
T& slot(std::vector<T>& items, int64_t index, const char* what) {
  TORCH_CHECK(index >= 0 && index < (1 << 16), "termchat_attn: ", what, " ", index, " out of range");
  if ((size_t)index >= items.size()) items.resize(index + 1);
  return items[index];
}

}  // namespace

// what stays fixed for one layer: its KV cache [blocks, kv heads, block size, 2 * head size]
void set_layer(int64_t index, int64_t group, const at::Tensor& kv_cache, std::string isa, double scale, int64_t sliding_window,
               double softcap, double k_scale, double v_scale, std::string kv_cache_dtype, bool own) {
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.size(3) % 2 == 0, "termchat_attn: a KV cache is [blocks, kv heads, block size, 2 * head size]");
  Layer& layer = slot(layers, index, "layer");
  slot(steps, group, "group");
  const int64_t blocks = kv_cache.size(0), heads = kv_cache.size(1), block = kv_cache.size(2);
  auto halves = kv_cache.view({blocks, heads, block * 2, -1}).chunk(2, 2);  // as CPUAttentionBackendImpl.forward
  own = own && isa == "vec" && kv_cache_dtype == "auto" && sliding_window < 0 && softcap == 0 && kv_cache.scalar_type() == at::kFloat &&
        (kv_cache.size(3) / 2 == 64 || kv_cache.size(3) / 2 == 128) && block % 64 == 0 && kv_cache.is_contiguous();
  layer = Layer{true, group, halves[0], halves[1], std::move(isa), std::move(kv_cache_dtype), scale, softcap, k_scale, v_scale, sliding_window, own};
}

void set_step(int64_t group, int64_t tokens, const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& block_table,
              const at::Tensor& slot_mapping, const at::Tensor& scheduler_metadata, bool causal, const c10::optional<at::Tensor>& dynamic_causal) {
  slot(steps, group, "group") = Step{true, tokens, query_start_loc, seq_lens, block_table, slot_mapping, scheduler_metadata, causal, dynamic_causal};
}

void end_steps() {
  for (auto& step : steps) step = Step{};
  prompts = at::Tensor();
}

// the prompt length of each request of the coming forward, in its metadata's order: rows of a
// prompt keep vLLM's kernel in a layer on the own kernel (own_attention)
void set_prompts(const at::Tensor& lengths) {
  TORCH_CHECK(lengths.dim() == 1 && lengths.scalar_type() == at::kInt && lengths.is_contiguous(), "termchat_attn: prompt lengths are int32 [requests]");
  prompts = lengths;
}

bool step_live(int64_t group) { return group >= 0 && (size_t)group < steps.size() && steps[group].live; }

// termchat's attention for a float32 layer: K blocks as vLLM's "vec" layout writes them
// ([head size][block size] per block and KV head), V blocks [block size][head size].
// Row i of request r sits at position p = seq_len - query_len + i and attends tokens 0..p.
// Its context is cut at multiples of SPLIT tokens; each part's softmax partials (max m,
// sum l, unnormalised output) come from one thread, and the parts merge in order. The
// query heads that share a KV head go through a part together (one load of K or V feeds
// each of them), but every head's sums run in the same order as alone.
namespace own {

#define UNROLL _Pragma("GCC unroll 16")  // loops over a few registers: kept in registers, not on the stack

using Vec = at::vec::Vectorized<float>;
constexpr int64_t SPLIT = 64;
constexpr int64_t W = Vec::size();
constexpr int64_t NV = SPLIT / W;  // vectors of scores in a part
constexpr int64_t MAX_GROUP = 32;  // query heads per KV head the kernel takes (attend() leaves larger groups to vLLM)
constexpr int64_t ACCUMULATORS = 16;  // vector registers a block of heads may hold
constexpr int64_t TILE = 16;  // rows of one request an item covers: a part's K and V stay in cache across them
constexpr int64_t PARTS_IN_FLIGHT = 1024;  // rows x parts of one parallel region: its scratch is at most 1024 x heads x (D + 2) floats
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// A loaded vector stays in its register: without this GCC folds the load into each head's
// FMA, loading K or V once per head, and a core that loads one 512-bit vector a cycle
// (AMD's Zen 4) waits on the loads.
inline Vec pinned(Vec x) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 raw = x;
  asm("" : "+v"(raw));
  return Vec(raw);
#elif defined(CPU_CAPABILITY_AVX2)
  __m256 raw = x;
  asm("" : "+x"(raw));
  return Vec(raw);
#else
  return x;
#endif
}

struct Geometry {
  const float* query; int64_t q_row, q_head;
  const float* key_cache; const float* value_cache; int64_t cache_block, cache_head;  // the two halves share strides
  const int32_t* block_table; int64_t table_row;
  int64_t heads, kv_heads, block;
  float scale;
};

struct Item { int64_t request, row0, row1, kv_head, part, first; };  // rows [row0, row1) of one request; first: its scratch row

// dispatch a runtime count 1..N to f.template operator()<count>()
template <int64_t N, class F>
void upto(int64_t count, F&& f) {
  [&]<int64_t... I>(std::integer_sequence<int64_t, I...>) { ((count == I + 1 ? f.template operator()<I + 1>() : void()), ...); }(std::make_integer_sequence<int64_t, N>{});
}

// scores of HB heads over the part's first V vectors of tokens: s[h][j] = scale * q_h . k_j
template <int64_t D, int64_t HB, int64_t V>
void scores(const float* q, int64_t q_head, const float* k, int64_t block, int64_t offset, float scale, float* s) {
  Vec acc[HB][V];
  UNROLL for (int64_t h = 0; h < HB; h++)
    UNROLL for (int64_t v = 0; v < V; v++) acc[h][v] = Vec(0.f);
  for (int64_t d = 0; d < D; d++) {
    Vec kd[V];
    UNROLL for (int64_t v = 0; v < V; v++) kd[v] = pinned(Vec::loadu(k + d * block + offset + v * W));
    UNROLL for (int64_t h = 0; h < HB; h++) {
      const Vec qd(q[h * q_head + d]);
      UNROLL for (int64_t v = 0; v < V; v++) acc[h][v] = at::vec::fmadd(qd, kd[v], acc[h][v]);
    }
  }
  UNROLL for (int64_t h = 0; h < HB; h++)
    UNROLL for (int64_t v = 0; v < V; v++) (acc[h][v] * Vec(scale)).store(s + h * SPLIT + v * W);
}

// out_h += sum over t < n of p[h][t] * v_t, for HB heads
template <int64_t D, int64_t HB>
void values(const float* p, const float* v, int64_t offset, int64_t n, float* out, int64_t out_stride) {
  constexpr int64_t C = D / W;
  Vec acc[HB][C];
  UNROLL for (int64_t h = 0; h < HB; h++)
    UNROLL for (int64_t c = 0; c < C; c++) acc[h][c] = Vec(0.f);
  for (int64_t t = 0; t < n; t++) {
    Vec vt[C];
    UNROLL for (int64_t c = 0; c < C; c++) vt[c] = pinned(Vec::loadu(v + (offset + t) * D + c * W));
    UNROLL for (int64_t h = 0; h < HB; h++) {
      const Vec pt(p[h * SPLIT + t]);
      UNROLL for (int64_t c = 0; c < C; c++) acc[h][c] = at::vec::fmadd(pt, vt[c], acc[h][c]);
    }
  }
  UNROLL for (int64_t h = 0; h < HB; h++)
    UNROLL for (int64_t c = 0; c < C; c++) acc[h][c].store(out + h * out_stride + 2 + c * W);
}

// Rows of one request against one part of its context: row r's `group` heads start at q[r]
// and see the part's first n[r] tokens; out[r] gets head h's {m, l, sum_t exp(s_t - m) v_t} at
// h * out_stride. The rows go through each phase together (every row's scores, then every
// row's softmax, then every row's values), so the part's K stays in L1 across the rows' scores
// and its V across their values; each row's sums run in the same order as for a row alone.
constexpr int64_t QUERY_BLOCK = 64;  // rows x heads whose scores one pass holds (16 KB)

template <int64_t D>
void part(const float* const* q, const int64_t* n, float* const* out, int64_t rows, int64_t q_head, int64_t group, const float* k,
          const float* v, int64_t block, int64_t offset, float scale, int64_t out_stride) {
  constexpr int64_t SCORE_HEADS = std::max<int64_t>(1, ACCUMULATORS / NV), VALUE_HEADS = std::max<int64_t>(1, ACCUMULATORS / (D / W));
  alignas(64) float s[QUERY_BLOCK * SPLIT];  // row r, head h: s + (r * group + h) * SPLIT
  for (int64_t r = 0; r < rows; r++) {
    const int64_t nv = (n[r] + W - 1) / W;
    for (int64_t h0 = 0; h0 < group; h0 += SCORE_HEADS)
      upto<SCORE_HEADS>(std::min(SCORE_HEADS, group - h0), [&]<int64_t HB>() {
        upto<NV>(nv, [&]<int64_t V>() { scores<D, HB, V>(q[r] + h0 * q_head, q_head, k, block, offset, scale, s + (r * group + h0) * SPLIT); });
      });
  }
  for (int64_t r = 0; r < rows; r++) {
    const int64_t nv = (n[r] + W - 1) / W;
    for (int64_t h = 0; h < group; h++) {
      float* sh = s + (r * group + h) * SPLIT;
      for (int64_t j = n[r]; j < nv * W; j++) sh[j] = NEG_INF;
      Vec top(NEG_INF);
      for (int64_t j = 0; j < nv; j++) top = at::vec::maximum(top, Vec::loadu(sh + j * W));
      const float m = top.reduce_max();
      Vec sum(0.f);
      for (int64_t j = 0; j < nv; j++) {
        const Vec e = (Vec::loadu(sh + j * W) - Vec(m)).exp_u20();
        e.store(sh + j * W);
      }
      for (int64_t j = n[r]; j < nv * W; j++) sh[j] = 0.f;  // exp(-inf) is 0 already; this says so for any exp
      for (int64_t j = 0; j < nv; j++) sum = sum + Vec::loadu(sh + j * W);
      out[r][h * out_stride] = m;
      out[r][h * out_stride + 1] = sum.reduce_add();
    }
  }
  for (int64_t r = 0; r < rows; r++)
    for (int64_t h0 = 0; h0 < group; h0 += VALUE_HEADS)
      upto<VALUE_HEADS>(std::min(VALUE_HEADS, group - h0), [&]<int64_t HB>() {
        values<D, HB>(s + (r * group + h0) * SPLIT, v, offset, n[r], out[r] + h0 * out_stride, out_stride);
      });
}

template <int64_t D>
void run(const Geometry& g, const std::vector<Item>& items, const std::vector<std::pair<int64_t, int64_t>>& rows,  // (row, its parts)
         const std::vector<int64_t>& positions, int64_t max_parts, float* scratch, float* output, int64_t out_row, int64_t out_head) {
  const int64_t group = g.heads / g.kv_heads;
  const int64_t part_stride = D + 2, head_stride = max_parts * part_stride;  // scratch: [row][head][part][m, l, D]
  auto slot = [&](int64_t scratch_row, int64_t head, int64_t p) { return scratch + (scratch_row * g.heads + head) * head_stride + p * part_stride; };
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < items.size(); i++) {
      const Item& it = items[i];
      const int64_t start = it.part * SPLIT;
      const int64_t block = g.block_table[it.request * g.table_row + start / g.block];  // checked before the region
      const float* k = g.key_cache + block * g.cache_block + it.kv_head * g.cache_head;
      const float* v = g.value_cache + block * g.cache_block + it.kv_head * g.cache_head;
      const float* q[TILE];  // the item's rows that see this part, gathered for part<D>()
      int64_t n[TILE];
      float* out[TILE];
      int64_t gathered = 0;
      const int64_t per_pass = std::max<int64_t>(1, QUERY_BLOCK / group);
      auto flush = [&] {
        if (gathered) part<D>(q, n, out, gathered, g.q_head, group, k, v, g.block, start % g.block, g.scale, head_stride);
        gathered = 0;
      };
      for (int64_t row = it.row0; row < it.row1; row++) {
        const int64_t p = positions[row];
        if (p < start) continue;
        q[gathered] = g.query + row * g.q_row + it.kv_head * group * g.q_head;
        n[gathered] = std::min(SPLIT, p + 1 - start);
        out[gathered] = slot(it.first + row - it.row0, it.kv_head * group, it.part);
        if (++gathered == per_pass) flush();
      }
      flush();
    }
#pragma omp for schedule(static)
    for (size_t r = 0; r < rows.size() * g.heads; r++) {
      const int64_t i = r / g.heads, h = r % g.heads;
      const auto [row, parts] = rows[i];
      float m = NEG_INF;
      for (int64_t p = 0; p < parts; p++) m = std::max(m, slot(i, h, p)[0]);
      float l = 0.f;
      Vec acc[D / W];
      UNROLL for (int64_t c = 0; c < D / W; c++) acc[c] = Vec(0.f);
      for (int64_t p = 0; p < parts; p++) {
        const float* o = slot(i, h, p);
        const float w = std::exp(o[0] - m);
        l += o[1] * w;
        UNROLL for (int64_t c = 0; c < D / W; c++) acc[c] = at::vec::fmadd(Vec(w), Vec::loadu(o + 2 + c * W), acc[c]);
      }
      const Vec inverse(1.f / l);
      UNROLL for (int64_t c = 0; c < D / W; c++) (acc[c] * inverse).store(output + row * out_row + h * out_head + c * W);
    }
  }
}

}  // namespace own

// vLLM's kernel over the step's whole query, the KV cache written
void vllm_attention(const Layer& layer, const Step& step, const at::Tensor& query, at::Tensor& output) {
  static const c10::OperatorHandle attention = vllm_op("_C::cpu_attention_with_kv_cache");
  const bool whole = step.tokens == query.size(0);
  std::vector<c10::IValue> stack{whole ? query : query.narrow(0, 0, step.tokens), layer.key_cache, layer.value_cache, whole ? output : output.narrow(0, 0, step.tokens),
           step.query_start_loc, step.seq_lens, layer.scale, step.causal, c10::IValue(), c10::SymInt(layer.sliding_window), step.block_table,
           layer.softcap, step.scheduler_metadata, c10::IValue(), step.dynamic_causal ? c10::IValue(*step.dynamic_causal) : c10::IValue(), layer.k_scale, layer.v_scale, layer.kv_cache_dtype};
  attention.callBoxed(stack);
}

// attend() for a layer set_layer() marked `own`: write the step's keys and values, then attend,
// with the own kernel for the rows after each request's prompt (decoding, verifying drafts) and
// vLLM's for a prompt's rows, where the own kernel is slower (a prefill's many rows: 0.72x at 4,000
// tokens of context). Which kernel a row gets depends on its position alone, never on what else the
// step holds, so a row comes out the same in any step; without prompt lengths every row is the own's.
void own_attention(const Layer& layer, const Step& step, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, at::Tensor& output) {
  const int64_t tokens = step.tokens, heads = query.size(1), kv_heads = key.size(1), d = query.size(2);
  const at::Tensor& kc = layer.key_cache;
  const int64_t blocks = kc.size(0), block = kc.size(2);
  const at::Tensor &start = step.query_start_loc, &seq = step.seq_lens, &table = step.block_table;
  TORCH_CHECK(query.stride(2) == 1 && key.stride(2) == 1 && value.stride(2) == 1 && output.stride(2) == 1 && kc.size(1) == kv_heads &&
              kc.size(3) == d && value.size(1) == kv_heads && query.size(0) >= tokens && key.size(0) >= tokens && output.size(0) >= tokens &&
              step.slot_mapping.size(0) >= tokens && step.slot_mapping.scalar_type() == at::kLong && start.scalar_type() == at::kInt &&
              seq.scalar_type() == at::kInt && table.scalar_type() == at::kInt && table.dim() == 2 && table.stride(1) == 1 &&
              start.is_contiguous() && seq.is_contiguous() && seq.size(0) + 1 <= start.size(0) && table.size(0) >= seq.size(0),
              "termchat_attn: a step's shapes do not fit its layer");
  float* key_cache = kc.data_ptr<float>();
  float* value_cache = layer.value_cache.data_ptr<float>();
  const int64_t cache_block = kc.stride(0), cache_head = kc.stride(1);
  const int64_t* slots = step.slot_mapping.data_ptr<int64_t>();
  const float *k = key.data_ptr<float>(), *v = value.data_ptr<float>();
  // The same bytes as vLLM's _C::cpu_attn_reshape_and_cache (test_attention), written here: calling
  // it (an OpenMP region of its own) cost 1.1-1.2 us more a layer, about 35 us a step (best of 300
  // rounds of 30 layers, five runs in turns, 50 and 300 tokens of context).
  for (int64_t t = 0; t < tokens; t++) {  // K as vLLM's "vec" layout keeps it ([d][block]), V row by row
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    TORCH_CHECK(slot / block < blocks, "termchat_attn: a slot is past the KV cache");
    const int64_t b = slot / block, o = slot % block;
    for (int64_t h = 0; h < kv_heads; h++) {
      float* kd = key_cache + b * cache_block + h * cache_head + o;
      const float* ks = k + t * key.stride(0) + h * key.stride(1);
      for (int64_t i = 0; i < d; i++) kd[i * block] = ks[i];
      std::memcpy(value_cache + b * cache_block + h * cache_head + o * d, v + t * value.stride(0) + h * value.stride(1), d * sizeof(float));
    }
  }
  const own::Geometry g{query.data_ptr<float>(), query.stride(0), query.stride(1), key_cache, value_cache, cache_block, cache_head,
                        table.data_ptr<int32_t>(), table.stride(0), heads, kv_heads, block, (float)layer.scale};
  const int32_t* s = start.data_ptr<int32_t>();
  const int32_t* lens = seq.data_ptr<int32_t>();
  static std::vector<int64_t> positions;  // one thread runs the forward: reused, not reallocated each layer
  static std::vector<own::Item> items;
  static std::vector<std::pair<int64_t, int64_t>> rows;
  static std::vector<float> scratch;
  positions.assign(tokens, -1), items.clear(), rows.clear();
  int64_t max_parts = 0;
  auto flush = [&] {
    if (rows.empty()) return;
    const size_t need = rows.size() * heads * max_parts * (d + 2);
    if (scratch.size() < need) scratch.resize(need);
    if (d == 64) own::run<64>(g, items, rows, positions, max_parts, scratch.data(), output.data_ptr<float>(), output.stride(0), output.stride(1));
    else own::run<128>(g, items, rows, positions, max_parts, scratch.data(), output.data_ptr<float>(), output.stride(0), output.stride(1));
    items.clear(), rows.clear(), max_parts = 0;
  };
  constexpr int64_t TILE = own::TILE;
  const int64_t requests = seq.size(0);
  const int32_t* prompt = prompts.defined() && prompts.size(0) >= requests ? prompts.data_ptr<int32_t>() : nullptr;
  std::vector<int64_t> prompt_rows(requests, 0);  // the first rows of each request that belong to its prompt
  bool any_prompt = false;
  for (int64_t r = 0; r < requests && prompt; r++) {
    const int64_t count = s[r + 1] - s[r], before = lens[r] - count;  // tokens cached before this step
    prompt_rows[r] = std::clamp<int64_t>(prompt[r] - before, 0, std::max<int64_t>(count, 0));
    any_prompt = any_prompt || prompt_rows[r] > 0;
  }
  if (any_prompt) vllm_attention(layer, step, query, output);  // every row; the generated ones are overwritten below
  for (int64_t r = 0; r < requests; r++) {
    const int64_t count = s[r + 1] - s[r] - prompt_rows[r], first = s[r] + prompt_rows[r], len = lens[r];
    TORCH_CHECK(count >= 0 && first >= 0 && first + count <= tokens && len >= count, "termchat_attn: a request's rows do not fit the step");
    for (int64_t p = 0; p * own::SPLIT < len; p++) {  // no exception may leave the parallel region: the table is checked here
      const int64_t index = p * own::SPLIT / block, entry = index < table.size(1) ? g.block_table[r * g.table_row + index] : -1;
      TORCH_CHECK(entry >= 0 && entry < blocks, "termchat_attn: request ", r, "'s block table does not cover its context");
    }
    for (int64_t row0 = first; row0 < first + count; row0 += TILE) {
      const int64_t row1 = std::min(row0 + TILE, first + count);
      const int64_t parts = (len - count + (row1 - first) - 1) / own::SPLIT + 1;  // of the tile's last row
      if ((int64_t)(rows.size() + row1 - row0) * std::max(max_parts, parts) > own::PARTS_IN_FLIGHT) flush();
      const int64_t scratch_row = rows.size();
      max_parts = std::max(max_parts, parts);
      for (int64_t row = row0; row < row1; row++) {
        positions[row] = len - count + (row - first);
        rows.emplace_back(row, positions[row] / own::SPLIT + 1);
      }
      for (int64_t h = 0; h < kv_heads; h++)
        for (int64_t p = 0; p < parts; p++) items.push_back({r, row0, row1, h, p, scratch_row});
    }
  }
  flush();
}

// query [tokens, heads, head size], key and value [tokens, kv heads, head size]: write key and
// value into the layer's KV cache at the step's slots, then attend into output [tokens, heads, head size].
// Without a step's metadata (vLLM's warm-up and profiling runs) it does nothing, as vLLM's forward;
// a layer that was never registered while a step is live is an error, never a silent skip.
void attend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, at::Tensor& output, int64_t index) {
  if (index < 0 || (size_t)index >= layers.size() || !layers[index].set) {  // registered at its group's first metadata build
    bool any = false;
    for (auto& step : steps) any = any || step.live;
    TORCH_CHECK(!any, "termchat_attn: layer ", index, " was never registered");
    return;  // warm-up before any step: nothing to do, as vLLM's forward without metadata
  }
  Layer& layer = layers[index];
  Step& step = steps[layer.group];
  if (!step.live) return;
  if (layer.own && step.causal && !step.dynamic_causal && query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
      value.scalar_type() == at::kFloat && output.scalar_type() == at::kFloat && key.size(1) > 0 && query.size(1) % key.size(1) == 0 &&
      query.size(1) / key.size(1) <= own::MAX_GROUP) {
    own_attention(layer, step, query, key, value, output);
    return;
  }
  static const c10::OperatorHandle reshape_and_cache = vllm_op("_C::cpu_attn_reshape_and_cache");
  std::vector<c10::IValue> stack{key, value, layer.key_cache, layer.value_cache, step.slot_mapping, layer.isa, layer.k_scale, layer.v_scale, layer.kv_cache_dtype};
  reshape_and_cache.callBoxed(stack);
  vllm_attention(layer, step, query, output);
}

void attend_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, int64_t) {}

TORCH_LIBRARY(termchat_attn, m) {
  m.def("set_layer(int index, int group, Tensor kv_cache, str isa, float scale, int sliding_window, float softcap, float k_scale, float v_scale, str kv_cache_dtype, bool own=False) -> ()", set_layer);
  m.def("set_step(int group, int tokens, Tensor query_start_loc, Tensor seq_lens, Tensor block_table, Tensor slot_mapping, Tensor scheduler_metadata, bool causal, Tensor? dynamic_causal) -> ()", set_step);
  m.def("end_steps() -> ()", end_steps);
  m.def("set_prompts(Tensor lengths) -> ()", set_prompts);
  m.def("step_live(int group) -> bool", step_live);
  m.def("attend(Tensor query, Tensor key, Tensor value, Tensor(a!) output, int index) -> ()");
}
TORCH_LIBRARY_IMPL(termchat_attn, CPU, m) { m.impl("attend", attend); }
TORCH_LIBRARY_IMPL(termchat_attn, Meta, m) { m.impl("attend", attend_meta); }
