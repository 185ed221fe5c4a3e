#include "common/model/tensor.h"

#include <utility>

#include "absl/strings/str_join.h"

namespace treespec {

namespace {
int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
}  // namespace

Tensor::Tensor(std::vector<int64_t> shape)
    : shape_(std::move(shape)), data_(NumElements(shape_), 0.0f) {}

Tensor::Tensor(std::vector<int64_t> shape, std::vector<float> data)
    : shape_(std::move(shape)), data_(std::move(data)) {}

std::string Tensor::ShapeString() const { return "[" + absl::StrJoin(shape_, ", ") + "]"; }

}  // namespace treespec
