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
// One thread runs a model's forward, so the state here is not locked.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <string>
#include <vector>

namespace {

struct Layer {
  bool set = false;
  int64_t group = 0;
  at::Tensor key_cache, value_cache;  // views of the layer's KV cache, as vLLM's forward makes them
  std::string isa, kv_cache_dtype;
  double scale = 1, softcap = 0, k_scale = 1, v_scale = 1;
  int64_t sliding_window = -1;
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
               double softcap, double k_scale, double v_scale, std::string kv_cache_dtype) {
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.size(3) % 2 == 0, "termchat_attn: a KV cache is [blocks, kv heads, block size, 2 * head size]");
  Layer& layer = slot(layers, index, "layer");
  slot(steps, group, "group");
  const int64_t blocks = kv_cache.size(0), heads = kv_cache.size(1), block = kv_cache.size(2);
  auto halves = kv_cache.view({blocks, heads, block * 2, -1}).chunk(2, 2);  // as CPUAttentionBackendImpl.forward
  layer = Layer{true, group, halves[0], halves[1], std::move(isa), std::move(kv_cache_dtype), scale, softcap, k_scale, v_scale, sliding_window};
}

void set_step(int64_t group, int64_t tokens, const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& block_table,
              const at::Tensor& slot_mapping, const at::Tensor& scheduler_metadata, bool causal, const c10::optional<at::Tensor>& dynamic_causal) {
  slot(steps, group, "group") = Step{true, tokens, query_start_loc, seq_lens, block_table, slot_mapping, scheduler_metadata, causal, dynamic_causal};
}

void end_steps() {
  for (auto& step : steps) step = Step{};
}

bool step_live(int64_t group) { return group >= 0 && (size_t)group < steps.size() && steps[group].live; }

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
  static const c10::OperatorHandle reshape_and_cache = vllm_op("_C::cpu_attn_reshape_and_cache");
  static const c10::OperatorHandle attention = vllm_op("_C::cpu_attention_with_kv_cache");
  std::vector<c10::IValue> stack{key, value, layer.key_cache, layer.value_cache, step.slot_mapping, layer.isa, layer.k_scale, layer.v_scale, layer.kv_cache_dtype};
  reshape_and_cache.callBoxed(stack);
  const bool whole = step.tokens == query.size(0);
  stack = {whole ? query : query.narrow(0, 0, step.tokens), layer.key_cache, layer.value_cache, whole ? output : output.narrow(0, 0, step.tokens),
           step.query_start_loc, step.seq_lens, layer.scale, step.causal, c10::IValue(), c10::SymInt(layer.sliding_window), step.block_table,
           layer.softcap, step.scheduler_metadata, c10::IValue(), step.dynamic_causal ? c10::IValue(*step.dynamic_causal) : c10::IValue(), layer.k_scale, layer.v_scale, layer.kv_cache_dtype};
  attention.callBoxed(stack);
}

void attend_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, int64_t) {}

TORCH_LIBRARY(termchat_attn, m) {
  m.def("set_layer(int index, int group, Tensor kv_cache, str isa, float scale, int sliding_window, float softcap, float k_scale, float v_scale, str kv_cache_dtype) -> ()", set_layer);
  m.def("set_step(int group, int tokens, Tensor query_start_loc, Tensor seq_lens, Tensor block_table, Tensor slot_mapping, Tensor scheduler_metadata, bool causal, Tensor? dynamic_causal) -> ()", set_step);
  m.def("end_steps() -> ()", end_steps);
  m.def("step_live(int group) -> bool", step_live);
  m.def("attend(Tensor query, Tensor key, Tensor value, Tensor(a!) output, int index) -> ()");
}
TORCH_LIBRARY_IMPL(termchat_attn, CPU, m) { m.impl("attend", attend); }
TORCH_LIBRARY_IMPL(termchat_attn, Meta, m) { m.impl("attend", attend_meta); }
