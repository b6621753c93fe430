// Produces tests/data/tokenizer_gpt2.json: a corpus of varied strings and the ids that
// GPT-2's reference encoder (npm gpt-3-encoder@1.1.4) gives them. Run offline:
//   (cd /tmp && npm install gpt-3-encoder@1.1.4)
//   NODE_PATH=/tmp/node_modules node tests/scripts/make_tokenizer_fixtures.js > tests/data/tokenizer_gpt2.json
'use strict';
const { encode } = require('gpt-3-encoder');

const corpus = [
  '', ' ', '  ', '\n', '\n\n', '\t', ' \t \n ', 'a', 'A', '!', '?', '.', ',',
  'Hello', 'Hello world', 'Hello, world!', ' Hello', 'Hello ', '  Hello  ', 'hello\nworld',
  'The quick brown fox jumps over the lazy dog.',
  'THE QUICK BROWN FOX', 'tHe QuIcK bRoWn', 'supercalifragilisticexpialidocious',
  "I'm", "you're", "we've", "he'll", "she'd", "it's", "don't", "can't", "won't", "y'all",
  "I'M SHOUTING", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "''", "'", "rock 'n' roll",
  'He said "hello" and left.', '“Smart quotes” and ‘single’ ones', "It’s a curly apostrophe",
  '0', '1', '42', '123', '1234', '12345', '3.14159', '-17', '+1 (555) 123-4567', '1,000,000',
  '2026-11-29', '10:45 PM', '$19.99', '€5', '£100', '¥500', '100%', '1e10', '0x1F', '0b1010',
  '١٢٣', '一二三', '½ ¼ ¾', 'Ⅷ Ⅻ', '²³', '①②③',
  'naïve café résumé', 'Straße', 'Ελληνικά', 'Русский язык', 'עברית', 'العربية', 'हिन्दी',
  'ไทย', '한국어', '日本語のテキスト', '中文文本测试', '漢字とかなカナ', 'Tiếng Việt', 'Türkçe ğüşıöç',
  'Ångström', 'Ωmega', 'ǅ ǈ ǋ', 'ﬁ ﬂ', 'Ａｂｃ　全角', '\u00a0nbsp\u00a0', 'zero\u200bwidth',
  'e\u0301 composed', 'a\u0308\u0301', 'Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǫ̗͓̅', '\u2028line sep', '\u3000ideographic space',
  '😀', '😀😃😄', '👍🏽', '👨‍👩‍👧‍👦', '🇺🇸🇬🇧', '❤️', '✨ sparkles ✨', 'I ❤ NY', '🤖 robots 🦾',
  '∑∫∂√∞', '≠≤≥', '→ ← ↑ ↓', '©®™', '♠♣♥♦', '★☆', '¶§†‡', '…', '—–-', '•',
  'def f(x):\n    return x * 2\n', 'int main() { return 0; }', 'for (int i = 0; i < n; ++i) {}',
  'console.log("hi");', '#include <stdio.h>', 'SELECT * FROM users WHERE id = 1;',
  '<div class="x">text</div>', '{"key": "value", "n": [1, 2, 3]}', 'a_b_c snake_case CamelCase',
  'https://example.com/path?q=1&r=2#frag', 'user@example.com', '/usr/local/bin', 'C:\\Windows\\System32',
  '    four spaces', '\tindented', 'trailing   ', 'a  b   c    d', ' \n \n', '\r\n', 'line1\r\nline2',
  '\n\n\nparagraph', 'x\n\n', '   \n', 'a\u00a0\u00a0b', 'tab\t\tsep',
  '!!!', '???', '...', '---', '***', '###', '!?!?', '@#$%^&*()', '<<>>', '[]{}()', ';;',
  'ending.', 'ending!', 'ending?', '(parenthetical)', '[bracketed]', 'semi;colon', 'a-b-c',
  'hyphen-ated words', 'e.g. i.e. etc.', 'U.S.A.', 'Mr. Smith', 'O\'Neil', 'rock-n-roll',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'abababababababababab', 'zzzz', 'ZZZZ',
  ',,,,', ',,', ', ,', 'a,b', 'a,,b', ',a,', '",",', 'x , y',
  '\u0000', '\u0001\u0002', '\u007f', '\u0080', '\u00ff', '\u0100', '\uffff', '\ud83d\ude00',
  'Once upon a time, there was a little model that could.',
  'KV cache offloading moves keys and values over PCIe.',
  'The FFN dimension of OPT-6.7B is 16384; its hidden size is 4096.',
  'Q: What is 2+2?\nA: 4', 'User: hi\nAssistant: hello!', '<|endoftext|>',
  'Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.',
];
// Programmatic variety: mixtures and whitespace patterns.
const words = ['alpha', 'Beta', 'γάμμα', 'δ', '42', '😀', "it's", '日本', '-', '  ', '\n', 'x1', '.'];
let seed = 12345;
function rnd(n) { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; }
for (let k = 0; k < 60; k++) {
  let s = '';
  const len = 1 + rnd(8);
  for (let i = 0; i < len; i++) s += words[rnd(words.length)] + (rnd(3) === 0 ? '' : ' ');
  corpus.push(s);
}
for (let n = 1; n <= 8; n++) corpus.push(' '.repeat(n) + 'x' + ' '.repeat(n));
const out = corpus.map(text => ({ text, ids: encode(text) }));
process.stdout.write(JSON.stringify(out, null, 0).replace(/\},\{/g, '},\n{') + '\n');
