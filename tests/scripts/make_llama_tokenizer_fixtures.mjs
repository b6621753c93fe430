// Produces tests/data/llama-tokenizer/: Llama-2's tokenizer (tokenizer.json in the layout
// meta-llama/Llama-2-7b-hf ships: Prepend + Replace normalizers, BPE with byte fallback;
// tokenizer_config.json) rebuilt from the vocabulary and merges that npm llama-tokenizer-js@1.2.2
// carries, and cases.json: a corpus of strings and the ids that package's own encoder (an
// independent SentencePiece-BPE implementation) gives them. Run offline:
//   (cd /tmp && npm install llama-tokenizer-js@1.2.2)
//   NODE_PATH=/tmp/node_modules node tests/scripts/make_llama_tokenizer_fixtures.mjs
import fs from 'fs';
import path from 'path';
import { createRequire } from 'module';
import { fileURLToPath } from 'url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const pkg = require.resolve('llama-tokenizer-js', { paths: [process.env.NODE_PATH || '/tmp/node_modules'] });
const { default: llama } = await import(pkg);

const out = path.join(here, '..', 'data', 'llama-tokenizer');
fs.mkdirSync(out, { recursive: true });

const vocab = {};
llama.vocabById.forEach((tok, id) => { vocab[tok] = id; });
// Its merges map "a b" (token strings) to the merge's priority, lowest first.
const merges = [...llama.merges.entries()].sort((a, b) => a[1] - b[1]).map(([pair]) => pair);
const special = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const tokenizer = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: [special(0, '<unk>'), special(1, '<s>'), special(2, '</s>')],
  normalizer: { type: 'Sequence', normalizers: [
    { type: 'Prepend', prepend: '\u2581' },
    { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] },
  pre_tokenizer: null,
  post_processor: null,
  decoder: { type: 'Sequence', decoders: [
    { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
    { type: 'ByteFallback' }, { type: 'Fuse' },
    { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
  model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
           end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, vocab, merges },
};
fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tokenizer));
fs.writeFileSync(path.join(out, 'tokenizer_config.json'), JSON.stringify({
  add_bos_token: true, add_eos_token: false, bos_token: '<s>', eos_token: '</s>', unk_token: '<unk>',
  model_max_length: 4096, tokenizer_class: 'LlamaTokenizer' }, null, 1) + '\n');

// The GPT-2 corpus (varied scripts, emoji, code, whitespace runs) plus strings that exercise
// byte fallback and long unsplit segments. Empty text and literal special tokens are left out:
// this encoder has no notion of either.
const gpt2 = JSON.parse(fs.readFileSync(path.join(here, '..', 'data', 'tokenizer_gpt2.json'), 'utf8'));
const texts = gpt2.map((c) => c.text).concat([
  'The capital of France is', '[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi [/INST]',
  '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝖒𝖆𝖙𝖍', '\u0000\u0001\u001f control', 'ᚠᛇᚻ᛫ᛒᛦᚦ', '🫠🫡🪿',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', '        eight spaces', 'x'.repeat(300),
]).filter((t) => t.length > 0 && !/<s>|<\/s>|<unk>/.test(t));
const cases = texts.map((text) => ({ text, ids: llama.encode(text, false, true) }));
fs.writeFileSync(path.join(out, 'cases.json'), JSON.stringify(cases, null, 0) + '\n');
console.error(`${cases.length} cases, ${Object.keys(vocab).length} tokens, ${merges.length} merges`);
