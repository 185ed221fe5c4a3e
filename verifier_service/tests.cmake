add_library(treespec_engine_test_util engine_test_util.cc)
target_link_libraries(treespec_engine_test_util PUBLIC treespec_engine treespec_drafter
  treespec_model_io)

treespec_add_test(NAME engine_test SOURCES engine_test.cc
  LIBS treespec_engine_test_util GTest::gmock)
treespec_add_test(NAME output_processor_test SOURCES output_processor_test.cc
  LIBS treespec_engine GTest::gmock)
treespec_add_test(NAME drafter_client_test SOURCES drafter_client_test.cc
  LIBS treespec_verifier treespec_drafter GTest::gtest)
treespec_add_test(NAME response_outbox_test SOURCES response_outbox_test.cc
  LIBS treespec_verifier GTest::gmock)
treespec_add_test(NAME drafter_directory_test SOURCES drafter_directory_test.cc
  LIBS treespec_verifier GTest::gtest)

# Speculation on the GPU backend (label gpu; skips without a GPU).
if(TREESPEC_HAVE_CUDA)
  treespec_add_test(NAME engine_gpu_test SOURCES engine_gpu_test.cc
    LIBS treespec_engine_test_util treespec_cuda_lm treespec_drafter treespec_backend treespec_tokenizer
    nlohmann_json::nlohmann_json
    LABELS gpu)
endif()
treespec_add_test(NAME step_cost_model_test SOURCES step_cost_model_test.cc
  LIBS treespec_engine GTest::gmock)
treespec_add_test(NAME step_cost_profiler_test SOURCES step_cost_profiler_test.cc
  LIBS treespec_engine GTest::gmock)
treespec_add_test(NAME serving_metrics_test SOURCES serving_metrics_test.cc
  LIBS treespec_verifier GTest::gmock)
treespec_add_test(NAME tree_selection_test SOURCES tree_selection_test.cc
  LIBS treespec_engine GTest::gmock)
treespec_add_test(NAME speculation_gate_test SOURCES speculation_gate_test.cc
  LIBS treespec_engine GTest::gtest)
