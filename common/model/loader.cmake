# Model I/O: config.json, safetensors, the weight loader and the random-model writer.
# Included from common/model/CMakeLists.txt; paths are relative to this folder.
add_library(treespec_model_io
  ${CMAKE_CURRENT_LIST_DIR}/tensor.cc
  ${CMAKE_CURRENT_LIST_DIR}/weights.cc
  ${CMAKE_CURRENT_LIST_DIR}/config.cc
  ${CMAKE_CURRENT_LIST_DIR}/deepseek_config.cc
  ${CMAKE_CURRENT_LIST_DIR}/dtype.cc
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cc
  ${CMAKE_CURRENT_LIST_DIR}/model_loader.cc
  ${CMAKE_CURRENT_LIST_DIR}/random_model.cc)
target_include_directories(treespec_model_io PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(treespec_model_io
  PUBLIC treespec_util absl::status absl::statusor absl::strings absl::span
  PRIVATE nlohmann_json::nlohmann_json absl::flat_hash_map absl::str_format Threads::Threads)

treespec_add_test(NAME config_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/config_test.cc
  LIBS treespec_model_io)
treespec_add_test(NAME safetensors_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_test.cc
  LIBS treespec_model_io nlohmann_json::nlohmann_json)
treespec_add_test(NAME model_loader_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_loader_test.cc
  LIBS treespec_model_io nlohmann_json::nlohmann_json)
