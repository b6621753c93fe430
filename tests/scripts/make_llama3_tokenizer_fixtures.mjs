// Produces tests/data/llama3-tokenizer/: Llama-3's tokenizer (tokenizer.json in the layout
// meta-llama/Meta-Llama-3-8B ships: a Split pre-tokenizer with Llama-3's regex, then ByteLevel
// without its own regex; a BPE model with ignore_merges; BOS added by a TemplateProcessing
// post-processor; 256 special tokens) rebuilt from the vocabulary and merges that npm
// llama3-tokenizer-js@1.2.0 carries, and cases.json: a corpus of strings and the ids that
// package's own encoder (an independent JavaScript implementation) gives them. Run offline:
//   (cd /tmp && npm install llama3-tokenizer-js@1.2.0)
//   NODE_PATH=/tmp/node_modules node tests/scripts/make_llama3_tokenizer_fixtures.mjs
import fs from 'fs';
import path from 'path';
import { createRequire } from 'module';
import { fileURLToPath } from 'url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const pkg = require.resolve('llama3-tokenizer-js', { paths: [process.env.NODE_PATH || '/tmp/node_modules'] });
const { default: llama3 } = await import(pkg);

const out = path.join(here, '..', 'data', 'llama3-tokenizer');
fs.mkdirSync(out, { recursive: true });

const kBase = 128000;  // ids below are BPE tokens, the 256 above special tokens
const vocab = {};
llama3.vocabById.slice(0, kBase).forEach((tok, id) => { vocab[tok] = id; });
// Its merges map "a b" (token strings) to the merge's priority, lowest first.
const merges = [...llama3.merges.entries()].sort((a, b) => a[1] - b[1]).map(([pair]) => pair);
const special = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const added = llama3.vocabById.slice(kBase).map((content, i) => special(kBase + i, content));
const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const tokenizer = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: added,
  normalizer: null,
  pre_tokenizer: { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false },
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  post_processor: { type: 'Sequence', processors: [
    { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    { type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [kBase], tokens: ['<|begin_of_text|>'] } } }] },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
           fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges },
};
fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tokenizer));
const decoder = {};
for (const a of added) decoder[String(a.id)] = { content: a.content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true };
// As the base model ships it: no add_bos_token (the post-processor adds BOS), no chat template.
fs.writeFileSync(path.join(out, 'tokenizer_config.json'), JSON.stringify({
  added_tokens_decoder: decoder, bos_token: '<|begin_of_text|>', clean_up_tokenization_spaces: true,
  eos_token: '<|end_of_text|>', model_input_names: ['input_ids', 'attention_mask'], model_max_length: 1000000000000000019884624838656,
  tokenizer_class: 'PreTrainedTokenizerFast' }, null, 1) + '\n');

// The GPT-2 corpus (varied scripts, emoji, code, whitespace runs) plus strings for what
// Llama-3's pattern does differently: digits in threes, contractions in any case, a
// punctuation mark joined to the word after it, newlines kept with the whitespace and
// punctuation before them, literal special tokens.
const gpt2 = JSON.parse(fs.readFileSync(path.join(here, '..', 'data', 'tokenizer_gpt2.json'), 'utf8'));
const texts = gpt2.map((c) => c.text).concat([
  'The capital of France is', '1234567890 and 3.14159 or 1,000,000', "I'M SURE IT'S FINE, WE'LL SEE. they'Re",
  '(hello) [world] {x}', '  \n  x', 'a\r\nb\r\n\r\nc', '\tindented\n\t\tmore', '...\n\nnext', 'end.  \n',
  'def f(x):\n    return x ** 2\n', '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>',
  '<|reserved_special_token_17|>', '<|not_a_special_token|>', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝖒𝖆𝖙𝖍', '\u0000\u0001\u001f control',
  'ᚠᛇᚻ᛫ᛒᛦᚦ', '🫠🫡🪿', '東京は日本の首都です。', 'Привет, мир!', 'مرحبا بالعالم', '        eight spaces',
  'x'.repeat(300), ' '.repeat(40) + 'after', '!!!!!!!!!!!!!!!!!!!!??', 'naïve café résumé', '٣٤٥ ١٢ digits',
]).filter((t) => t.length > 0);
const cases = texts.map((text) => ({ text, ids: llama3.encode(text, { bos: false, eos: false }) }));
fs.writeFileSync(path.join(out, 'cases.json'), JSON.stringify(cases, null, 0) + '\n');
console.error(`${cases.length} cases, ${Object.keys(vocab).length} tokens, ${merges.length} merges, ${added.length} special`);
