add_library(treespec_engine_test_util engine_test_util.cc)
target_link_libraries(treespec_engine_test_util PUBLIC treespec_engine treespec_drafter
  treespec_model_io)

treespec_add_test(NAME engine_test SOURCES engine_test.cc
  LIBS treespec_engine_test_util GTest::gmock)
treespec_add_test(NAME output_processor_test SOURCES output_processor_test.cc
  LIBS treespec_engine GTest::gmock)
treespec_add_test(NAME drafter_client_test SOURCES drafter_client_test.cc
  LIBS treespec_verifier treespec_drafter GTest::gtest)
