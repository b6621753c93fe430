#include "openai/reasoning.h"

namespace kvpr {

namespace {
constexpr std::string_view kOpen = "<think>", kClose = "</think>";

// Length of the longest suffix of `s` that is a proper prefix of `tag` (what may still become it).
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}
}  // namespace

ReasoningSplitter::Parts ReasoningSplitter::feed(std::string_view delta) {
  Parts out;
  held_.append(delta);
  if (state_ == State::Start) {
    if (held_.size() < kOpen.size() && kOpen.substr(0, held_.size()) == held_) return out;  // "<thi"...
    if (held_.compare(0, kOpen.size(), kOpen) == 0) {
      state_ = State::Reasoning;
      held_.erase(0, kOpen.size());
    } else {
      state_ = State::Content;
    }
  }
  if (state_ == State::Reasoning) {
    if (const size_t end = held_.find(kClose); end != std::string::npos) {
      out.reasoning = held_.substr(0, end);
      out.content = held_.substr(end + kClose.size());
      state_ = State::Content;
      held_.clear();
      return out;
    }
    const size_t keep = partial_tag(held_, kClose);
    out.reasoning = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
  out.content = std::move(held_);
  held_.clear();
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::finish() {
  Parts out;
  (state_ == State::Reasoning ? out.reasoning : out.content) = std::move(held_);
  held_.clear();
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::split(std::string_view text) {
  ReasoningSplitter s;
  Parts a = s.feed(text), b = s.finish();
  a.reasoning += b.reasoning;
  a.content += b.content;
  return a;
}

}  // namespace kvpr
