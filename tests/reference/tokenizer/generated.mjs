// Long inputs made by rule instead of being committed; tests/test_tokenizer.c
// builds the same texts with the same rules (keep the two in step).
export function lcgLetters(n, seed) {
  // 31-bit LCG; letters a-z from bits 16..30
  let s = seed >>> 0;
  let out = "";
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1103515245) + 12345) & 0x7fffffff;
    out += String.fromCharCode(97 + ((s >>> 16) % 26));
  }
  return out;
}

export function generatedTexts() {
  const cjk = [];
  for (let i = 0; i < 30000; i++) cjk.push(String.fromCodePoint(0x4e00 + ((i * 7919) % 20902)));
  return [
    { name: "long_word", rule: "lcg_letters(100000, seed 1)", text: lcgLetters(100000, 1) },
    { name: "long_cjk", rule: "U+4E00 + (i*7919 % 20902), i < 30000", text: cjk.join("") },
    { name: "long_digits", rule: "'0123456789' x 3000", text: "0123456789".repeat(3000) },
    { name: "long_spaces", rule: "' ' x 20000 + 'x' + '\\n' x 5000", text: " ".repeat(20000) + "x" + "\n".repeat(5000) },
  ];
}
