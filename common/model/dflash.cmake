# The DFlash drafter's model (arXiv 2602.06036): its config.json and weights (its own and the
# target's embedding and head); a CausalLm of its body runs it. Included from
# common/model/CMakeLists.txt.
add_library(treespec_dflash
  ${CMAKE_CURRENT_LIST_DIR}/dflash_config.cc
  ${CMAKE_CURRENT_LIST_DIR}/dflash_weights.cc)
target_include_directories(treespec_dflash PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(treespec_dflash
  PUBLIC treespec_model treespec_model_io treespec_tree absl::status absl::statusor
  PRIVATE nlohmann_json::nlohmann_json absl::strings)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(treespec_dflash PRIVATE -ffp-contract=off)
endif()

# Against PyTorch with Transformers' Qwen3 modules: tests/data/dflash_reference.json and the
# random drafter it names (tools/dflash_reference.py).
treespec_add_test(NAME dflash_model_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/dflash_model_test.cc
  LIBS treespec_dflash nlohmann_json::nlohmann_json GTest::gmock)
