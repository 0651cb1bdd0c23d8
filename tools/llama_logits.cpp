// Native llama.cpp's logits at every position of one token sequence: the outside truth
// the conformance suite holds our quantized forward against (tests/conformance/; the
// llama.cpp binaries give no per-position logits). Built by `make peers` against the
// peer's own static libraries (Makefile: $(PEER_BIN)/llama-logits), so it computes
// exactly what llama-server computes with the same file and context size.
//
//   llama-logits MODEL.gguf IDS.bin OUT.bin [--ctx N] [--threads N] [--kv f32|f16]
//
// IDS.bin: int32 token ids (little-endian, as numpy writes them); OUT.bin: float32
// logits [n_ids, n_vocab] in row order. --ctx is the context llama.cpp is created with
// (default: the sequence's length): it is what picks LongRoPE's long or short factors
// (llama_model::get_rope_factors). --kv is the KV cache's type (default f32, as our
// default cache: llama.cpp's own default is f16, whose rounding of every key and value
// would be a difference of storage, not of the model's maths). One batch, one sequence;
// exit 1 with a message on any error.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

int fail(const std::string& msg) {
  std::fprintf(stderr, "llama-logits: %s\n", msg.c_str());
  return 1;
}

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

bool no_progress(float, void*) { return true; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc % 2)
    return fail("usage: llama-logits MODEL.gguf IDS.bin OUT.bin [--ctx N] [--threads N] [--kv f32|f16]");
  int64_t ctx_size = 0;
  int threads = 2;
  ggml_type kv = GGML_TYPE_F32;
  for (int i = 4; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ctx")) ctx_size = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--kv") && !std::strcmp(argv[i + 1], "f32")) kv = GGML_TYPE_F32;
    else if (!std::strcmp(argv[i], "--kv") && !std::strcmp(argv[i + 1], "f16")) kv = GGML_TYPE_F16;
    else return fail(std::string("unknown option ") + argv[i] + " " + argv[i + 1]);
  }
  std::FILE* f = std::fopen(argv[2], "rb");
  if (!f) return fail(std::string("cannot open ") + argv[2]);
  std::vector<llama_token> ids;
  for (int32_t v; std::fread(&v, sizeof v, 1, f) == 1;) ids.push_back(v);
  std::fclose(f);
  const int32_t n = int32_t(ids.size());
  if (n == 0) return fail("no token ids");
  if (ctx_size < n) ctx_size = n;

  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.progress_callback = no_progress;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return fail(std::string("cannot load ") + argv[1]);
  const int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (llama_token t : ids)
    if (t < 0 || t >= vocab) return fail("token id " + std::to_string(t) + " outside the vocabulary");
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(ctx_size);
  cp.n_batch = cp.n_ubatch = uint32_t(n);
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.type_k = cp.type_v = kv;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return fail("cannot create a context");
  llama_batch batch = llama_batch_init(n, 0, 1);
  for (int32_t i = 0; i < n; ++i) {
    batch.token[i] = ids[size_t(i)];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = n;
  if (llama_decode(ctx, batch) != 0) return fail("llama_decode failed");
  std::FILE* out = std::fopen(argv[3], "wb");
  if (!out) return fail(std::string("cannot write ") + argv[3]);
  for (int32_t i = 0; i < n; ++i) {
    const float* row = llama_get_logits_ith(ctx, i);
    if (!row || std::fwrite(row, sizeof(float), size_t(vocab), out) != size_t(vocab))
      return fail("cannot write the logits");
  }
  if (std::fclose(out) != 0) return fail("cannot write the logits");
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
