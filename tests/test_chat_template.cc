// Chat templates (engine/chat_template.h): each renders the text its model's Jinja template
// gives for the same messages, and auto picks a template from tokenizer_config.json.
#include <gtest/gtest.h>

#include <fstream>

#include "engine/chat_template.h"
#include "engine/error.h"
#include "engine/json.h"
#include "test_util.h"

using namespace kvpr;

namespace {
const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", " Hi\n"}, {"assistant", "Hello"}, {"user", "More"}};
}  // namespace

TEST(ChatTemplate, RendersEachFormat) {
  EXPECT_EQ(render_chat("plain", kChat).prompt,
            "System: Be brief.\n\nUser:  Hi\n\n\nAssistant: Hello\n\nUser: More\n\nAssistant:");
  EXPECT_EQ(render_chat("llama-2", kChat).prompt,
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello </s><s>[INST] More [/INST]");
  EXPECT_EQ(render_chat("mistral", kChat).prompt, "[INST] Be brief.\n\n Hi\n [/INST]Hello</s>[INST] More [/INST]");
  EXPECT_EQ(render_chat("zephyr", kChat).prompt,
            "<|system|>\nBe brief.</s>\n<|user|>\n Hi\n</s>\n<|assistant|>\nHello</s>\n<|user|>\nMore</s>\n<|assistant|>\n");
  RenderedChat ml = render_chat("chatml", kChat);
  EXPECT_EQ(ml.prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi\n<|im_end|>\n<|im_start|>assistant\nHello"
            "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ml.stop_tokens, std::vector<std::string>{"<|im_end|>"});
  // Qwen2 and Qwen2.5: ChatML, with their default system turn only when none is given.
  EXPECT_EQ(render_chat("qwen2.5", kChat).prompt, ml.prompt);
  EXPECT_EQ(render_chat("qwen2.5", kChat).stop_tokens, std::vector<std::string>{"<|im_end|>"});
  EXPECT_EQ(render_chat("qwen2.5", {{"user", "Hi"}}).prompt,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat("qwen2", {{"user", "Hi"}, {"assistant", "Yo"}, {"system", "late"}}).prompt,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>system\nlate<|im_end|>\n<|im_start|>assistant\n");
  // Llama-3 trims every message; 3.1 and 3.2 open with Meta's system header.
  RenderedChat l3 = render_chat("llama-3", kChat);
  EXPECT_EQ(l3.prompt,
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nMore<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(l3.stop_tokens, std::vector<std::string>{"<|eot_id|>"});
  EXPECT_EQ(render_chat("llama-3.1", {{"user", "Hi"}}).prompt,
            "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_NE(render_chat("llama-3.2", kChat).prompt.find("\n\nBe brief.<|eot_id|>"), std::string::npos);
  EXPECT_THROW(render_chat("vicuna", kChat), Error);
  EXPECT_FALSE(known_chat_template("vicuna"));
}

TEST(ChatTemplate, AutoReadsTokenizerConfig) {
  test::TempDir dir;
  std::string why;
  EXPECT_EQ(auto_chat_template(dir.path(), &why), "plain");
  EXPECT_EQ(why, "no tokenizer_config.json");
  auto with = [&](const std::string& jinja) {
    json::Value cfg(json::Object{});
    cfg.set("chat_template", jinja);
    std::ofstream(dir.file("tokenizer_config.json")) << cfg.dump();
    return auto_chat_template(dir.path(), &why);
  };
  EXPECT_EQ(with("{{ bos_token }}[INST] <<SYS>>\\n{{ system }}"), "llama-2");
  EXPECT_EQ(with("{{ bos_token }}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"),
            "mistral");
  EXPECT_EQ(with("{{ '<|user|>\\n' + message['content'] + eos_token }}{{ '<|assistant|>' }}"), "zephyr");
  EXPECT_EQ(with("{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'}}"), "chatml");
  EXPECT_EQ(with("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}{{ '<|eot_id|>' }}"),
            "llama-3");
  EXPECT_EQ(with("<|start_header_id|><|eot_id|>Cutting Knowledge Date: December 2023 {{ date_string }}"), "llama-3.1");
  EXPECT_EQ(with("<|start_header_id|><|eot_id|>Cutting Knowledge Date {{ strftime_now('%d %b %Y') }}"), "llama-3.2");
  // Qwen2-Instruct's template, verbatim; Qwen2.5-Instruct's is the fixture's.
  EXPECT_EQ(with("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
                 "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
                 "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                 "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
            "qwen2");
  EXPECT_EQ(auto_chat_template(test::data_path("qwen2-tokenizer"), &why), "qwen2.5");
  EXPECT_EQ(with("{{ messages }}"), "plain");
  EXPECT_NE(why.find("not one kvprd has built in"), std::string::npos);
}
