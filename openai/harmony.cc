#include "openai/harmony.h"

namespace kvpr {

namespace {

constexpr std::string_view kStart = "<|start|>", kChannel = "<|channel|>", kMessage = "<|message|>",
                           kConstrain = "<|constrain|>", kEnd = "<|end|>", kCall = "<|call|>", kReturn = "<|return|>";

// The word after `key` in `header` (up to a space, '<' or the end), or "".
std::string word_after(const std::string& header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string::npos) return "";
  size_t b = at + key.size();
  while (b < header.size() && header[b] == ' ') ++b;
  size_t e = b;
  while (e < header.size() && header[e] != ' ' && header[e] != '<') ++e;
  return header.substr(b, e - b);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

const std::vector<std::string>& harmony_special_tokens() {
  static const std::vector<std::string> kTokens = {std::string(kStart),     std::string(kChannel), std::string(kMessage),
                                                   std::string(kConstrain), std::string(kEnd),     std::string(kCall),
                                                   std::string(kReturn)};
  return kTokens;
}

void HarmonyStream::route(Delta& out, const std::string& text) {
  if (text.empty()) return;
  if (state_ == State::Header) {
    header_ += text;
  } else if (!recipient_.empty()) {
    body_ += text;  // a call's arguments: whole, when the message ends
  } else if (channel_ == "analysis" || (answer_only_ && channel_ != "final")) {
    out.reasoning += text;
  } else {
    out.content += text;
  }
}

void HarmonyStream::close_message(Delta& out) {
  if (!recipient_.empty()) {
    const std::string name = recipient_.rfind("functions.", 0) == 0 ? recipient_.substr(10) : recipient_;
    out.calls.push_back(ToolCallText{name, trim(body_)});
  }
  channel_.clear();
  recipient_.clear();
  body_.clear();
  header_.clear();
  state_ = State::Body;  // until the next header; stray text is content
}

HarmonyStream::Delta HarmonyStream::feed(std::string_view text) {
  Delta out;
  pending_.append(text);
  size_t done = 0;  // pending_[0, done) is consumed
  if (!opened_) raw_.append(text);
  while (done < pending_.size()) {
    const size_t lt = pending_.find("<|", done);
    if (lt == std::string::npos) {
      // All of it, but a last '<' that may open a special token.
      const size_t keep = pending_.back() == '<' ? 1 : 0;
      route(out, pending_.substr(done, pending_.size() - done - keep));
      done = pending_.size() - keep;
      break;
    }
    route(out, pending_.substr(done, lt - done));
    done = lt;
    const std::string_view rest = std::string_view(pending_).substr(lt);
    std::string_view token;
    bool partial = false;
    for (const std::string& t : harmony_special_tokens()) {
      if (rest.substr(0, t.size()) == t) token = t;
      else if (rest.size() < t.size() && t.compare(0, rest.size(), rest) == 0) partial = true;
    }
    if (token.empty()) {
      if (partial) break;  // held until decided
      route(out, "<|");  // not one of the format's
      done += 2;
      continue;
    }
    done += token.size();
    if (token == kStart) {
      if (state_ == State::Body && (!channel_.empty() || !recipient_.empty())) close_message(out);
      state_ = State::Header;
      header_.clear();
    } else if (token == kChannel) {
      // The first message's header begins here (the prompt ended with "<|start|>assistant").
      if (state_ == State::Body) {
        if (!channel_.empty() || !recipient_.empty()) close_message(out);
        state_ = State::Header;
        header_.clear();
      }
      header_ += kChannel;
    } else if (token == kConstrain) {
      if (state_ == State::Header) header_ += ' ';
    } else if (token == kMessage) {
      if (state_ == State::Header) {
        channel_ = word_after(header_, kChannel);
        recipient_ = word_after(header_, "to=");
        state_ = State::Body;
        header_.clear();
        if (!opened_) {  // from here the text goes where its channel says
          opened_ = true;
          raw_.clear();
        }
      }
    } else {  // <|end|>, <|call|>, <|return|>
      close_message(out);
    }
  }
  pending_.erase(0, done);
  return out;
}

HarmonyStream::Delta HarmonyStream::finish() {
  Delta out;
  if (!opened_) {  // the model never began a message: what it wrote is the answer
    out.content = std::move(raw_);
    raw_.clear();
    pending_.clear();
    return out;
  }
  const std::string rest = std::move(pending_);
  pending_.clear();
  route(out, rest);
  if (state_ == State::Body) close_message(out);  // a message cut off counts as what it was
  return out;
}

HarmonyStream::Delta HarmonyStream::parse(std::string_view text, bool answer_only) {
  HarmonyStream s(answer_only);
  Delta a = s.feed(text), b = s.finish();
  a.reasoning += b.reasoning;
  a.content += b.content;
  for (auto& c : b.calls) a.calls.push_back(std::move(c));
  return a;
}

}  // namespace kvpr
