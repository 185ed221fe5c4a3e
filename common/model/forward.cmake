# The CPU forward pass: operators, tree attention, KV cache, TP plan/shard/communicator,
# sampling and the CPU CausalLm. Included from common/model/CMakeLists.txt.
add_library(treespec_model
  ${CMAKE_CURRENT_LIST_DIR}/causal_lm.cc
  ${CMAKE_CURRENT_LIST_DIR}/communicator.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_causal_lm.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_mlp.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_ops.cc
  ${CMAKE_CURRENT_LIST_DIR}/forward_batch.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/moe_router.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index.cc
  ${CMAKE_CURRENT_LIST_DIR}/sampling.cc
  ${CMAKE_CURRENT_LIST_DIR}/top_k.cc
  ${CMAKE_CURRENT_LIST_DIR}/tp_plan.cc
  ${CMAKE_CURRENT_LIST_DIR}/tp_shard.cc
  ${CMAKE_CURRENT_LIST_DIR}/tree_attention.cc)
target_include_directories(treespec_model PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(treespec_model
  PUBLIC treespec_model_io treespec_util absl::status absl::statusor absl::span
    absl::flat_hash_map treespec_tree Threads::Threads
  PRIVATE absl::flat_hash_set absl::strings)
# Batch invariance needs a * b + c to mean the same thing in every kernel: no implicit FMA
# contraction (GCC contracts by default in GNU mode, Clang within expressions). The AVX2 matmul
# kernel uses explicit FMA intrinsics. Always optimise the kernels, even in Debug builds.
# -Wno-psabi: GCC and clang note that 32-byte vector arguments of the portable kernel's internal
# helpers would pass differently with AVX; they never cross a library boundary.
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(treespec_model PRIVATE -ffp-contract=off)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cpu_ops.cc
    ${CMAKE_CURRENT_LIST_DIR}/tree_attention.cc PROPERTIES COMPILE_OPTIONS
    "-O3;$<$<CXX_COMPILER_ID:GNU,Clang>:-Wno-psabi>")
endif()

# Tests. Random weights and small configs for them live in the header cpu_test_util.h.
foreach(t cpu_ops_test moe_router_test kv_cache_test communicator_test tp_plan_test sampling_test)
  treespec_add_test(NAME ${t} SOURCES ${CMAKE_CURRENT_LIST_DIR}/${t}.cc LIBS treespec_model)
endforeach()
foreach(t tree_attention_test cpu_causal_lm_test top_k_test feature_capture_test)
  treespec_add_test(NAME ${t} SOURCES ${CMAKE_CURRENT_LIST_DIR}/${t}.cc
    LIBS treespec_model treespec_tree)
endforeach()
# Against Hugging Face transformers: tests/data/model_reference.json and the checkpoints it names.
treespec_add_test(NAME model_reference_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_reference_test.cc
  LIBS treespec_model nlohmann_json::nlohmann_json)
