// A host fp32 tensor: row-major, owning. Copies are explicit (Clone) because they are costly.
#ifndef TREESPEC_COMMON_MODEL_TENSOR_H_
#define TREESPEC_COMMON_MODEL_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace treespec {

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape);  // zero-filled
  Tensor(std::vector<int64_t> shape, std::vector<float> data);
  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  Tensor Clone() const { return Tensor(shape_, data_); }

  bool empty() const { return data_.empty(); }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  absl::Span<float> span() { return absl::MakeSpan(data_); }
  absl::Span<const float> span() const { return absl::MakeConstSpan(data_); }
  // Row r of a rank-2 tensor. [dim(1)]
  const float* row(int64_t r) const { return data_.data() + r * shape_[1]; }

  std::string ShapeString() const;  // "[4096, 256]"

 private:
  std::vector<int64_t> shape_;
  std::vector<float> data_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_TENSOR_H_
