// An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
// Thrown by the request parsers (request.h) and by the daemon's routes; the HTTP layer sends it,
// knowing nothing else of the API.
#pragma once

#include <string>

#include "engine/base/json.h"

namespace kvpr {

struct ApiError {
  int status;
  std::string message;
  std::string type;
  std::string param;
};

ApiError bad_request(std::string msg, std::string param = "");
// The error's JSON body (a message quoting request bytes is made valid UTF-8).
json::Value error_body(const ApiError& e);

}  // namespace kvpr
