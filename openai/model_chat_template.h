// A model's own chat template, rendered by the Jinja interpreter (jinja/jinja.h) with the
// variables transformers' apply_chat_template passes: messages (OpenAI's, tool calls with their
// arguments as objects), tools (none without), documents (none), add_generation_prompt, the
// tokenizer's special tokens (bos_token, eos_token, unk_token, pad_token) and the request's
// chat_template_kwargs. This is what kvprd and `kvpr generate --chat` render by default; the
// built-in templates (chat_template.h) are the fallback for a model without one, and the family
// its text matches still gives the stop strings and the tool-call parser.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "openai/chat_template.h"
#include "jinja/jinja.h"

namespace kvpr {

class ModelChatTemplate {
 public:
  // The template of the model in `model_dir` (chat_template.jinja, else tokenizer_config.json's;
  // its "tool_use" one too where it has named ones), or none when it has no template. Throws,
  // naming the file and the line, for one kvpr cannot parse.
  static std::optional<ModelChatTemplate> load(const std::string& model_dir);
  // --chat-template FILE.jinja: that file, with the special tokens of the model in `model_dir`.
  static ModelChatTemplate from_file(const std::string& path, const std::string& model_dir);

  // The prompt for `messages` (with options.tools, the tool_use template where there is one);
  // stops from `family` (chat_template_family of the text; none for a template kvpr does not know).
  // Throws kvpr::Error for what the template refuses (its raise_exception) or fails on.
  RenderedChat render(const std::vector<ChatMessage>& messages, const ChatOptions& options) const;

  const std::string& origin() const { return origin_; }  // "tokenizer_config.json", "chat_template.jinja", a path
  const std::string& family() const { return family_; }  // "" when its text is none of the built-in ones
  const std::string& text() const { return text_; }
  bool writes_system() const { return writes_system_; }  // a system message shows in its prompt

 private:
  ModelChatTemplate(std::string text, std::string origin, const std::string& model_dir);

  std::string text_, origin_, family_, family_why_;
  std::shared_ptr<const jinja::Template> default_, tool_use_;
  jinja::Dict special_tokens_;
  bool writes_system_ = true;
};

// What --chat-template chose for the model in `model_dir`: "auto" (the model's own template, else
// the built-in one its family matches, else plain), a built-in name, or a FILE.jinja (a path: it
// has a '/' or ends in .jinja). Throws a one-line error for an unknown name or a template that
// does not parse.
struct ChatTemplateChoice {
  std::string family;           // the built-in template whose stops and tool calls apply (render_chat's name)
  std::string default_system;   // chatml: the template's own system message
  std::shared_ptr<const ModelChatTemplate> model;  // what renders the prompts; null: `family`, built in
  std::string why;              // a few words for the log
};
ChatTemplateChoice choose_chat_template(const std::string& model_dir, const std::string& choice);
// Whether --chat-template's value names a file (it has a '/' or ends in .jinja) rather than a built-in.
bool is_chat_template_file(const std::string& choice);

}  // namespace kvpr
