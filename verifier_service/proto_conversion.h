// The one place where Generation API protos (and the Drafter API's, as the verifier reads
// them) become engine types and back.
#ifndef TREESPEC_VERIFIER_SERVICE_PROTO_CONVERSION_H_
#define TREESPEC_VERIFIER_SERVICE_PROTO_CONVERSION_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/spec_limits_proto.h"
#include "common/tokenizer/tokenizer.h"
#include "treespec/v1/drafter.pb.h"
#include "treespec/v1/generation.pb.h"
#include "verifier_service/drafter_directory.h"
#include "verifier_service/request.h"

namespace treespec {

// Reads the request (tokenizing text with `tokenizer`, which may be null for ids-only servers).
// A text of more than `max_prompt_tokens` tokens is INVALID_ARGUMENT as soon as that is
// certain, without tokenizing the rest. Field-level checks that need the model happen in
// Engine::Validate.
absl::StatusOr<GenerationRequest> FromProto(const v1::GenerateRequest& proto,
                                            const Tokenizer* tokenizer, int32_t bos_token_id,
                                            int max_prompt_tokens, std::string request_id);

// The mode a drafter session is opened with.
v1::SpeculationMode ToProtoMode(SpecMode mode);

v1::GenerateResponse ToProto(const GenerationUpdate& update, const std::string& request_id);

// Kinds other than NGRAM and DRAFT_MODEL (none the verifier can ask for yet) are left out.
DrafterDescription FromProto(const v1::DrafterInfo& proto);

}  // namespace treespec

#endif  // TREESPEC_VERIFIER_SERVICE_PROTO_CONVERSION_H_
