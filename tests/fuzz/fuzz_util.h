// Helpers shared by the libFuzzer targets: an invariant check that aborts (libFuzzer then keeps
// the input as a crash), and a scratch directory per process for loaders that read files.
#ifndef TREESPEC_TESTS_FUZZ_FUZZ_UTIL_H_
#define TREESPEC_TESTS_FUZZ_FUZZ_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/model/config.h"

namespace treespec::fuzz {

// The smallest model the loaders and the CPU forward take: 1 layer, hidden 16, 2 q / 1 kv heads
// of 8, vocab 32; a Qwen3 has a tied head and q/k norms (the seeds in
// corpus/safetensors_fuzz/ are of these shapes).
inline ModelConfig TinyFuzzConfig(bool qwen3, int context) {
  ModelConfig c;
  c.architecture = qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 1;
  c.num_q_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = context;
  c.tie_word_embeddings = qwen3;
  c.qk_norm = qwen3;
  return c;
}

[[noreturn]] inline void Fail(const char* file, int line, const char* condition,
                              const std::string& detail) {
  std::fprintf(stderr, "%s:%d: invariant broken: %s\n  %s\n", file, line, condition,
               detail.c_str());
  std::abort();
}

// A directory of its own for this process (parallel fuzzing jobs must not share files),
// removed at a normal exit.
inline const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/treespec-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    auto* path = new std::string(pattern);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(ScratchDir(), ignored);
    });
    return path;
  }();
  return *dir;
}

// Replaces the file at `path` with `size` bytes of `data`.
inline void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace treespec::fuzz

// Aborts with `detail` (a std::string expression, evaluated only on failure) unless `condition`.
#define FUZZ_CHECK(condition, detail)                                                   \
  do {                                                                                  \
    if (!(condition)) ::treespec::fuzz::Fail(__FILE__, __LINE__, #condition, (detail)); \
  } while (0)

#endif  // TREESPEC_TESTS_FUZZ_FUZZ_UTIL_H_
