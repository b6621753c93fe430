#include "openai/response.h"

#include <optional>

#include "engine/base/error.h"

namespace kvpr {

namespace {

// A list of one value (moved in: an initializer list would copy it).
json::Array list_of(json::Value v) {
  json::Array a;
  a.push_back(std::move(v));
  return a;
}

// A key already there keeps its value (the first, likelier alternative wins a clash).
void add_if_absent(json::Object& o, std::string key, json::Value v) {
  for (const auto& [k, _] : o)
    if (k == key) return;
  o.emplace_back(std::move(key), std::move(v));
}

const char* object_name(const ResponseState& r, bool chunk) {
  if (!r.chat) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

// tool_choice "required": the answer (a JSON list of {"name", "parameters"}, as its schema made
// it) as calls; nullopt when it is not one (cut off by max_tokens).
std::optional<std::vector<ToolCallText>> forced_calls(const std::string& answer) {
  try {
    std::vector<ToolCallText> calls;
    const json::Value list = json::parse(answer);  // (kept: the loop's range refers into it)
    for (const auto& c : list.as_array()) {
      const json::Value* name = c.is_object() ? c.find("name") : nullptr;
      const json::Value* params = c.is_object() ? c.find("parameters") : nullptr;
      if (!name || !params || !name->is_string()) return std::nullopt;  // (its schema makes both)
      calls.push_back({name->as_string(), params->dump_python()});
    }
    return calls;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// OpenAI's tool_calls of a message (or, streamed, of a delta: each with its index), with fresh
// ids; only the first with parallel_tool_calls false.
json::Array tool_calls_json(const ResponseState& r, const std::vector<ToolCallText>& calls, bool indexed,
                            const ResponseContext& ctx) {
  json::Array out;
  for (size_t k = 0; k < calls.size() && (r.tools.parallel || k == 0); ++k) {
    json::Object call;
    if (indexed) call.emplace_back("index", static_cast<int64_t>(k));
    call.emplace_back("id", ctx.ids.tool_call_id(ctx.nine_alnum_tool_call_ids));
    call.emplace_back("type", "function");
    call.emplace_back("function", json::Object{{"name", calls[k].name}, {"arguments", calls[k].arguments}});
    out.push_back(std::move(call));
  }
  return out;
}

// The text of the request's marker that event `ev`'s token is, or "".
std::string marker_text(const ResponseState& r, const EngineEvent& ev) {
  for (const auto& [id, text] : r.markers)
    if (ev.token == id) return text;
  return "";
}

json::Value completions_logprobs(json::Array tokens, json::Array lps, json::Array tops, json::Array offsets) {
  return json::Object{{"tokens", std::move(tokens)}, {"token_logprobs", std::move(lps)},
                      {"top_logprobs", std::move(tops)}, {"text_offset", std::move(offsets)}};
}

// The echoed prompt's part of a completions logprobs object: its tokens (text as the echo shows
// it, so text_offset indexes the returned text), their log-probabilities (null for the first,
// which nothing predicts) and alternatives.
json::Value prompt_logprobs_json(const ChoiceState& c, int64_t& offset, const Tokenizer& tok) {
  // Token texts that concatenate to the echoed text: without special tokens for a text prompt
  // (its BOS is not in the echo), with them for a prompt given as ids.
  std::string joined;
  for (int32_t id : c.prompt) joined += tok.token_bytes(id, true);
  const bool skip = joined == c.echo_text;
  json::Array tokens, lps, offsets, tops;
  for (size_t k = 0; k < c.prompt.size(); ++k) {
    const std::string t = tok.token_bytes(c.prompt[k], skip);
    tokens.push_back(sanitize_utf8(t));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.size());
    if (k == 0 || k - 1 >= c.prompt_logprobs.size()) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    lps.push_back(c.prompt_logprobs[k - 1]);
    json::Object top;
    if (k - 1 < c.prompt_tops.size())
      for (const auto& [id, lp] : c.prompt_tops[k - 1]) add_if_absent(top, sanitize_utf8(tok.token_bytes(id, false)), lp);
    add_if_absent(top, sanitize_utf8(t), c.prompt_logprobs[k - 1]);  // the prompt's own token is always there
    tops.push_back(std::move(top));
  }
  return completions_logprobs(std::move(tokens), std::move(lps), std::move(tops), std::move(offsets));
}

// OpenAI's logprobs objects for tokens [from, to) of a choice. Chat: content[i] = {token,
// logprob, bytes, top_logprobs: the top_logprobs most likely tokens}. Completions: tokens,
// token_logprobs, text_offset (from `offset`, advanced past the tokens) and top_logprobs[i] =
// {token text: logprob} for the `logprobs` most likely tokens plus the sampled one (so up to
// logprobs + 1 entries, as OpenAI documents).
json::Value logprobs_json(const ResponseState& r, const ChoiceState& c, size_t from, size_t to, int64_t& offset,
                          const Tokenizer& tok) {
  auto text_of = [&](int32_t id) { return sanitize_utf8(tok.token_bytes(id, false)); };
  if (r.chat) {
    auto entry = [&](int32_t id, double lp) {
      const std::string t = tok.token_bytes(id, false);
      json::Array bytes;
      for (unsigned char b : t) bytes.push_back(static_cast<int64_t>(b));
      return json::Object{{"token", sanitize_utf8(t)}, {"logprob", lp}, {"bytes", std::move(bytes)}};
    };
    json::Array content;
    for (size_t k = from; k < to; ++k) {
      json::Object e = entry(c.tokens[k], c.logprobs[k]);
      json::Array top;
      if (k < c.tops.size())
        for (const auto& [id, lp] : c.tops[k]) top.push_back(entry(id, lp));
      e.emplace_back("top_logprobs", std::move(top));
      content.push_back(std::move(e));
    }
    return json::Object{{"content", std::move(content)}};
  }
  json::Array tokens, lps, offsets, tops;
  for (size_t k = from; k < to; ++k) {
    const std::string t = text_of(c.tokens[k]);
    tokens.push_back(t);
    lps.push_back(c.logprobs[k]);
    offsets.push_back(offset);
    json::Object top;
    if (k < c.tops.size())
      for (const auto& [id, lp] : c.tops[k]) add_if_absent(top, text_of(id), lp);  // first (likelier) wins a clash
    add_if_absent(top, t, c.logprobs[k]);  // the sampled token is always there
    tops.push_back(std::move(top));
    offset += static_cast<int64_t>(t.size());
  }
  return completions_logprobs(std::move(tokens), std::move(lps), std::move(tops), std::move(offsets));
}

// A whole choice's logprobs: an echoed prompt's tokens first, then the generated ones.
json::Value choice_logprobs(const ResponseState& r, const ChoiceState& c, const Tokenizer& tok) {
  int64_t off = 0;
  json::Value prompt_part = r.sampling.echo && !r.chat ? prompt_logprobs_json(c, off, tok) : json::Value();
  off = static_cast<int64_t>(c.echo_text.size());
  json::Value lp = logprobs_json(r, c, 0, c.tokens.size(), off, tok);
  if (prompt_part.is_object())
    for (auto& [key, arr] : lp.as_object()) {
      json::Array joined = prompt_part.find(key)->as_array();
      for (auto& v : arr.as_array()) joined.push_back(std::move(v));
      arr = std::move(joined);
    }
  return lp;
}

// A chat choice's message: content (less reasoning, with a reasoning parser), tool calls as the
// request's tool_choice has them; *finish becomes "tool_calls" when the answer is calls.
json::Value chat_message(const ResponseState& r, const ChoiceState& c, std::string* finish, const ResponseContext& ctx) {
  json::Value msg(json::Object{{"role", "assistant"}, {"content", c.text}});
  if (r.harmony) {  // reasoning, answer and calls from the channels
    // (A JSON response format: content is the final message alone, the constrained one.)
    const HarmonyStream::Delta h = HarmonyStream::parse(c.marked_text, r.sampling.json_object || !r.sampling.json_schema.is_null());
    msg.set("content", h.content.empty() && (!h.reasoning.empty() || !h.calls.empty()) ? json::Value()
                                                                                         : json::Value(h.content));
    msg.set("reasoning_content", h.reasoning.empty() ? json::Value() : json::Value(h.reasoning));
    if (!h.calls.empty() && r.tools.parse) {
      msg.set("tool_calls", tool_calls_json(r, h.calls, false, ctx));
      *finish = "tool_calls";
    }
    return msg;
  }
  std::string content = c.text;
  if (ctx.reasoning) {
    const ReasoningSplitter::Parts parts = ReasoningSplitter::split(c.text);
    content = parts.content;
    msg.set("content", parts.content.empty() && !parts.reasoning.empty() ? json::Value() : json::Value(parts.content));
    msg.set("reasoning_content", parts.reasoning.empty() ? json::Value() : json::Value(parts.reasoning));
  }
  if (!r.tools.named.empty()) {  // the answer is the named function's arguments
    msg.set("content", nullptr);
    msg.set("tool_calls", tool_calls_json(r, {{r.tools.named, content}}, false, ctx));
  } else if (r.tools.required) {  // the answer is a list of calls
    if (auto calls = forced_calls(content)) {
      msg.set("content", nullptr);
      msg.set("tool_calls", tool_calls_json(r, *calls, false, ctx));
      *finish = "tool_calls";
    }
  } else if (r.tools.parse) {
    const ToolCallParse p = parse_tool_calls(r.tools.parser, r.markers.empty() ? content : c.marked_text);
    if (!p.calls.empty()) {
      msg.set("content", p.content ? json::Value(*p.content) : json::Value());
      msg.set("tool_calls", tool_calls_json(r, p.calls, false, ctx));
      *finish = "tool_calls";
    }
  }
  return msg;
}

}  // namespace

ResponseState start_response(const GenerateRequest& req, const Prompts& prompts, std::string id, int64_t created,
                             std::string model) {
  ResponseState r;
  r.chat = req.chat;
  r.sampling = req.sampling;
  r.tools = req.tools;
  // (A forced call's answer is the body of a message its prompt opened: the arguments or the list.)
  r.harmony = req.harmony && req.answer_opening.empty();
  r.markers = req.markers;
  r.id = std::move(id);
  r.created = created;
  r.model = std::move(model);
  for (size_t pi = 0; pi < prompts.ids.size(); ++pi)
    for (int64_t j = 0; j < req.sampling.n; ++j) {
      ChoiceState c;
      c.prompt = prompts.ids[pi];
      if (req.sampling.echo) c.echo_text = prompts.texts[pi];
      if (req.tools.parse && !req.harmony) c.tool_stream = ToolCallStream(req.tools.parser);
      // harmony with a JSON response format: content is the final message alone.
      if (r.harmony) c.harmony = HarmonyStream(req.sampling.json_object || !req.sampling.json_schema.is_null());
      r.choices.push_back(std::move(c));
    }
  return r;
}

bool add_event(ResponseState& r, size_t i, const EngineEvent& ev) {
  ChoiceState& c = r.choices[i];
  if (c.done) return false;
  if (!ev.error.empty()) {
    c.done = true;
    c.finish = "error";
    r.error = ev.error;
    r.failure = ev.refused ? refusal_error(r.tools, ev) : ApiError{500, ev.error, "server_error", ""};
    return true;
  }
  if (ev.token >= 0) {
    c.tokens.push_back(ev.token);
    c.logprobs.push_back(ev.logprob);
    c.tops.push_back(ev.top);
  }
  if (!ev.prompt_logprobs.empty()) {
    c.prompt_logprobs = ev.prompt_logprobs;
    c.prompt_tops = ev.prompt_top;
  }
  // The worker's text leaves special tokens out; the parsers see where the model wrote theirs.
  c.marked_text += marker_text(r, ev) + ev.text;
  c.text += ev.text;
  if (ev.finish_reason.empty()) return false;
  c.done = true;
  c.finish = ev.finish_reason;
  c.cached_tokens = ev.cached_tokens;
  return true;
}

Usage usage_of(const ResponseState& r) {
  Usage u;
  int64_t prompt_cached = 0;
  const size_t n = static_cast<size_t>(r.sampling.n);
  for (size_t i = 0; i < r.choices.size(); ++i) {
    if (i % n == 0) {
      u.prompt_tokens += static_cast<int64_t>(r.choices[i].prompt.size());
      u.cached_tokens += prompt_cached;
      prompt_cached = 0;
    }
    prompt_cached = std::max(prompt_cached, r.choices[i].cached_tokens);
    u.completion_tokens += static_cast<int64_t>(r.choices[i].tokens.size());
  }
  u.cached_tokens += prompt_cached;
  return u;
}

json::Value usage_json(const Usage& u) {
  return json::Object{{"prompt_tokens", u.prompt_tokens},
                      {"completion_tokens", u.completion_tokens},
                      {"total_tokens", u.prompt_tokens + u.completion_tokens},
                      {"prompt_tokens_details", json::Object{{"cached_tokens", u.cached_tokens}}}};
}

json::Value response_json(const ResponseState& r, const ResponseContext& ctx) {
  json::Array choices;
  for (size_t i = 0; i < r.choices.size(); ++i) {
    const ChoiceState& c = r.choices[i];
    std::string finish = c.finish;
    json::Object ch{{"index", static_cast<int64_t>(i)}};
    if (r.chat) ch.emplace_back("message", chat_message(r, c, &finish, ctx));
    else ch.emplace_back("text", c.echo_text + c.text);
    ch.emplace_back("logprobs", r.sampling.logprobs ? choice_logprobs(r, c, ctx.tok) : json::Value());
    ch.emplace_back("finish_reason", finish);
    choices.push_back(std::move(ch));
  }
  return json::Object{{"id", r.id}, {"object", object_name(r, false)}, {"created", r.created}, {"model", r.model},
                      {"choices", std::move(choices)}, {"usage", usage_json(usage_of(r))}};
}

json::Value usage_chunk(const ResponseState& r) {
  return json::Object{{"id", r.id}, {"object", object_name(r, true)}, {"created", r.created}, {"model", r.model},
                      {"choices", json::Array{}}, {"usage", usage_json(usage_of(r))}};
}

namespace {

// One choice's streamed share of an event: its chunks, and the logprobs not yet reported, which
// ride on the next chunk that goes out.
class ChunkWriter {
 public:
  ChunkWriter(ResponseState& r, size_t i, const ResponseContext& ctx) : r_(r), c_(r.choices[i]), i_(i), ctx_(ctx) {}

  std::vector<json::Value> chunks;

  void add(json::Object choice) {
    chunks.push_back(json::Object{{"id", r_.id}, {"object", object_name(r_, true)}, {"created", r_.created},
                                  {"model", r_.model}, {"choices", list_of(std::move(choice))}});
  }
  void add_delta(json::Object delta) {
    add(json::Object{{"index", index()}, {"delta", std::move(delta)}, {"logprobs", pending_logprobs()},
                     {"finish_reason", nullptr}});
  }
  json::Value index() const { return static_cast<int64_t>(i_); }
  json::Value pending_logprobs() {
    if (!r_.sampling.logprobs || c_.lp_sent >= c_.tokens.size()) return nullptr;
    if (c_.lp_sent == 0) c_.lp_offset = static_cast<int64_t>(c_.echo_text.size());
    json::Value v = logprobs_json(r_, c_, c_.lp_sent, c_.tokens.size(), c_.lp_offset, ctx_.tok);
    c_.lp_sent = c_.tokens.size();
    return v;
  }

  // Chat: reasoning and answer as separate delta fields; the answer as the tool choice has it.
  // Returns the calls found at the end (then the finish reason is tool_calls).
  std::vector<ToolCallText> chat(const EngineEvent& ev) {
    const bool finished = !ev.finish_reason.empty();
    if (r_.harmony) return harmony(ev, finished);
    std::string reasoning, content = ev.text;
    if (ctx_.reasoning) {  // text that may still be a tag waits
      ReasoningSplitter::Parts parts = c_.reasoning.feed(ev.text);
      if (finished) {
        ReasoningSplitter::Parts rest = c_.reasoning.finish();
        parts.reasoning += rest.reasoning;
        parts.content += rest.content;
      }
      reasoning = std::move(parts.reasoning);
      content = std::move(parts.content);
    }
    std::vector<ToolCallText> calls;
    if (!r_.tools.named.empty()) {
      named_arguments(content, finished);
      content.clear();
    } else if (r_.tools.required) {
      content.clear();  // the list of calls, sent whole at the end
      if (finished) {
        if (auto forced = forced_calls(c_.text)) calls = std::move(*forced);
        else content = c_.text;
      }
    } else if (r_.tools.parse) {
      // Text before a call goes out as it comes; the calls when the answer is complete.
      content = marker_text(r_, ev) + content;
      content = c_.tool_stream.feed(content).content;
      if (finished) {
        ToolCallStream::Delta rest = c_.tool_stream.finish();
        content += rest.content;
        calls = std::move(rest.calls);
      }
    }
    if (!reasoning.empty() || !content.empty()) {
      json::Object delta;
      if (!reasoning.empty()) delta.emplace_back("reasoning_content", reasoning);
      if (!content.empty()) delta.emplace_back("content", content);
      add_delta(std::move(delta));
    }
    if (!calls.empty()) add_delta(json::Object{{"tool_calls", tool_calls_json(r_, calls, true, ctx_)}});
    return calls;
  }

  // gpt-oss: reasoning and answer as their channels come, each call when its message ends (its
  // arguments whole; the finish reason tool_calls).
  std::vector<ToolCallText> harmony(const EngineEvent& ev, bool finished) {
    HarmonyStream::Delta d = c_.harmony.feed(marker_text(r_, ev) + ev.text);
    if (finished) {
      HarmonyStream::Delta rest = c_.harmony.finish();
      d.reasoning += rest.reasoning;
      d.content += rest.content;
      for (auto& call : rest.calls) d.calls.push_back(std::move(call));
    }
    if (!r_.tools.parse) d.calls.clear();  // no tools asked for: nothing is a call
    if (!d.reasoning.empty() || !d.content.empty()) {
      json::Object delta;
      if (!d.reasoning.empty()) delta.emplace_back("reasoning_content", d.reasoning);
      if (!d.content.empty()) delta.emplace_back("content", d.content);
      add_delta(std::move(delta));
    }
    if (!d.calls.empty()) {
      json::Value calls = tool_calls_json(r_, d.calls, true, ctx_);
      for (size_t k = 0; k < calls.as_array().size(); ++k)  // indices across the answer's calls
        calls.as_array()[k].set("index", static_cast<int64_t>(c_.calls_sent + k));
      c_.calls_sent += d.calls.size();
      add_delta(json::Object{{"tool_calls", std::move(calls)}});
    }
    // The caller reads a non-empty list at the end as "the answer made calls" (finish reason tool_calls).
    return c_.calls_sent > 0 && finished ? std::vector<ToolCallText>(c_.calls_sent) : std::vector<ToolCallText>();
  }

  // A named tool choice: the function's arguments as they come, its id and name with the first piece.
  void named_arguments(const std::string& content, bool finished) {
    if (content.empty() && !finished) return;
    json::Object function{{"arguments", content}};
    json::Object call{{"index", 0}};
    if (!c_.tool_call_sent) {
      call.emplace_back("id", ctx_.ids.tool_call_id(ctx_.nine_alnum_tool_call_ids));
      call.emplace_back("type", "function");
      function.insert(function.begin(), json::Object::value_type("name", r_.tools.named));
      c_.tool_call_sent = true;
    }
    call.emplace_back("function", std::move(function));
    add_delta(json::Object{{"tool_calls", list_of(std::move(call))}});
  }

 private:
  ResponseState& r_;
  ChoiceState& c_;
  size_t i_;
  const ResponseContext& ctx_;
};

}  // namespace

std::vector<json::Value> stream_chunks(ResponseState& r, size_t i, const EngineEvent& ev, const ResponseContext& ctx) {
  if (!ev.error.empty())
    return {error_body(r.failure)};
  ChoiceState& c = r.choices[i];
  ChunkWriter w(r, i, ctx);
  if (r.chat && !c.sent_role) {
    c.sent_role = true;
    w.add(json::Object{{"index", w.index()}, {"delta", json::Object{{"role", "assistant"}, {"content", ""}}},
                       {"logprobs", nullptr}, {"finish_reason", nullptr}});
  }
  if (!r.chat && r.sampling.echo && !c.echo_sent) {  // the prompt first (with its logprobs when asked)
    c.echo_sent = true;
    int64_t off = 0;
    w.add(json::Object{{"index", w.index()}, {"text", c.echo_text},
                       {"logprobs", r.sampling.logprobs ? prompt_logprobs_json(c, off, ctx.tok) : json::Value()},
                       {"finish_reason", nullptr}});
  }
  std::vector<ToolCallText> calls;
  if (r.chat) {
    calls = w.chat(ev);
  } else if (!ev.text.empty()) {
    w.add(json::Object{{"index", w.index()}, {"text", ev.text}, {"logprobs", w.pending_logprobs()},
                       {"finish_reason", nullptr}});
  }
  if (!ev.finish_reason.empty()) {
    json::Object ch{{"index", w.index()}};
    if (r.chat) ch.emplace_back("delta", json::Object{});
    else ch.emplace_back("text", "");
    ch.emplace_back("logprobs", w.pending_logprobs());
    ch.emplace_back("finish_reason", calls.empty() ? ev.finish_reason : std::string("tool_calls"));
    w.add(std::move(ch));
  }
  return std::move(w.chunks);
}

}  // namespace kvpr
