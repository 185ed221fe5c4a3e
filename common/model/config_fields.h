// Reading config.json fields with errors that name them ("config.json field `x`: ..."), shared
// by the parsers of each architecture family (config.cc, deepseek_config.cc). Internal to
// treespec_model_io.
#ifndef TREESPEC_COMMON_MODEL_CONFIG_FIELDS_H_
#define TREESPEC_COMMON_MODEL_CONFIG_FIELDS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace treespec::config_fields {

using Json = nlohmann::json;

inline absl::Status FieldError(absl::StatusCode code, absl::string_view field, absl::string_view what) {
  return absl::Status(code, absl::StrCat("config.json field `", field, "`: ", what));
}
inline absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return FieldError(absl::StatusCode::kInvalidArgument, field, what);
}
inline absl::Status Unsupported(absl::string_view field, absl::string_view what) {
  return FieldError(absl::StatusCode::kUnimplemented, field, what);
}

// The float the model will use for a number read as a double. Range checks belong on this
// float, not on the double: 1e-60 is > 0 but rounds to 0, 1e39 is finite but not as a float
// (and converting a double beyond float's range is undefined behaviour).
inline absl::StatusOr<float> AsFloat(absl::string_view field, double v) {
  if (!(std::abs(v) <= std::numeric_limits<float>::max())) {
    return Invalid(field, absl::StrCat("must be a finite number within float range, got ", v));
  }
  return static_cast<float>(v);
}

// Reads fields of one JSON object; `prefix` ("" or "rope_scaling.") names them in errors.
// A JSON null counts as absent, as it does for the transformers config classes.
class FieldReader {
 public:
  FieldReader(const Json& object, std::string prefix)
      : object_(object), prefix_(std::move(prefix)) {}

  std::string Name(absl::string_view key) const { return absl::StrCat(prefix_, key); }

  const Json* Find(absl::string_view key) const {
    auto it = object_.find(std::string(key));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool Has(absl::string_view key) const { return Find(key) != nullptr; }
  // True when the key is present, even as null.
  bool Contains(absl::string_view key) const { return object_.contains(std::string(key)); }

  absl::StatusOr<std::optional<double>> OptionalNumber(absl::string_view key) const {
    const Json* v = Find(key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number())
      return Invalid(Name(key), absl::StrCat("expected a number, got ", v->dump()));
    return std::optional<double>(v->get<double>());
  }

  absl::StatusOr<std::optional<int64_t>> OptionalInt(absl::string_view key) const {
    const Json* v = Find(key);
    if (v == nullptr) return std::optional<int64_t>();
    if (v->is_number_integer()) return std::optional<int64_t>(v->get<int64_t>());
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15) {
        return std::optional<int64_t>(static_cast<int64_t>(d));
      }
    }
    return Invalid(Name(key), absl::StrCat("expected an integer, got ", v->dump()));
  }

  absl::StatusOr<std::optional<bool>> OptionalBool(absl::string_view key) const {
    const Json* v = Find(key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean())
      return Invalid(Name(key), absl::StrCat("expected true or false, got ", v->dump()));
    return std::optional<bool>(v->get<bool>());
  }

  absl::StatusOr<std::optional<std::string>> OptionalString(absl::string_view key) const {
    const Json* v = Find(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string())
      return Invalid(Name(key), absl::StrCat("expected a string, got ", v->dump()));
    return std::optional<std::string>(v->get<std::string>());
  }

  // A required positive integer that fits an int.
  absl::StatusOr<int> PositiveInt(absl::string_view key) const {
    ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalInt(key));
    if (!v.has_value()) return Invalid(Name(key), "required field is missing");
    return CheckPositive(key, *v);
  }
  absl::StatusOr<int> PositiveIntOr(absl::string_view key, int fallback) const {
    ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalInt(key));
    if (!v.has_value()) return fallback;
    return CheckPositive(key, *v);
  }
  // A required integer in [0, 2^30].
  absl::StatusOr<int> NonNegativeInt(absl::string_view key) const {
    ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalInt(key));
    if (!v.has_value()) return Invalid(Name(key), "required field is missing");
    if (*v < 0 || *v > (int64_t{1} << 30)) {
      return Invalid(Name(key), absl::StrCat("must be an integer in [0, 2^30], got ", *v));
    }
    return static_cast<int>(*v);
  }
  absl::StatusOr<double> NumberOr(absl::string_view key, double fallback) const {
    ASSIGN_OR_RETURN(std::optional<double> v, OptionalNumber(key));
    return v.value_or(fallback);
  }
  absl::StatusOr<double> RequiredNumber(absl::string_view key) const {
    ASSIGN_OR_RETURN(std::optional<double> v, OptionalNumber(key));
    if (!v.has_value()) return Invalid(Name(key), "required field is missing");
    return *v;
  }
  absl::StatusOr<bool> BoolOr(absl::string_view key, bool fallback) const {
    ASSIGN_OR_RETURN(std::optional<bool> v, OptionalBool(key));
    return v.value_or(fallback);
  }

 private:
  absl::StatusOr<int> CheckPositive(absl::string_view key, int64_t v) const {
    if (v <= 0 || v > (int64_t{1} << 30)) {
      return Invalid(Name(key), absl::StrCat("must be a positive integer, got ", v));
    }
    return static_cast<int>(v);
  }

  const Json& object_;
  std::string prefix_;
};

}  // namespace treespec::config_fields

#endif  // TREESPEC_COMMON_MODEL_CONFIG_FIELDS_H_
