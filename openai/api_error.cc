#include "openai/api_error.h"

#include "engine/text/tokenizer.h"

namespace kvpr {

ApiError bad_request(std::string msg, std::string param) {
  return {400, std::move(msg), "invalid_request_error", std::move(param)};
}

json::Value error_body(const ApiError& e) {
  json::Object err{{"message", sanitize_utf8(e.message)},
                   {"type", e.type},
                   {"param", e.param.empty() ? json::Value() : json::Value(sanitize_utf8(e.param))},
                   {"code", e.status}};
  return json::Object{{"error", std::move(err)}};
}

}  // namespace kvpr
