// The conversations every golden renders, each with both templates.
// Roles are system / user / assistant only: the native renderer refuses tool
// messages, tool calls and thinking parts (tests/test_chat.c checks that).
const sys = "You are a concise assistant.";

export const conversations = [
  {
    name: "prompt_single_user",
    add_generation_prompt: true,
    messages: [{ role: "user", content: "Explain why the sky is blue in simple terms." }],
  },
  {
    name: "sft_single_turn",
    add_generation_prompt: false,
    messages: [
      { role: "user", content: "What is 2+2?" },
      { role: "assistant", content: "2 + 2 = 4." },
    ],
  },
  {
    name: "sft_single_turn_with_prompt",
    add_generation_prompt: true,
    messages: [
      { role: "user", content: "What is 2+2?" },
      { role: "assistant", content: "2 + 2 = 4." },
    ],
  },
  {
    name: "system_multi_turn",
    add_generation_prompt: false,
    messages: [
      { role: "system", content: sys },
      { role: "user", content: "Name a prime number." },
      { role: "assistant", content: "7" },
      { role: "user", content: "And an even one?" },
      { role: "assistant", content: "2 is the only even prime." },
    ],
  },
  {
    name: "system_multi_turn_prompt",
    add_generation_prompt: true,
    messages: [
      { role: "system", content: sys },
      { role: "user", content: "Name a prime number." },
      { role: "assistant", content: "7" },
      { role: "user", content: "And an even one?" },
    ],
  },
  {
    name: "no_system_multi_turn",
    add_generation_prompt: true,
    messages: [
      { role: "user", content: "Hi!" },
      { role: "assistant", content: "Hello! How can I help you today?" },
      { role: "user", content: "Tell me a joke." },
      { role: "assistant", content: "Why did the chicken cross the road? To get to the other side." },
      { role: "user", content: "Another one." },
    ],
  },
  {
    // DeepSeek-V3 gathers every system message, joined by a blank line, in
    // front of the first turn; ChatML renders a later one where it stands.
    name: "two_system_messages",
    add_generation_prompt: false,
    messages: [
      { role: "system", content: "First rule: be brief." },
      { role: "user", content: "Ready?" },
      { role: "system", content: "Second rule: answer in French." },
      { role: "assistant", content: "Oui." },
    ],
  },
  {
    name: "later_system_only",
    add_generation_prompt: true,
    messages: [
      { role: "user", content: "Start." },
      { role: "system", content: "Switch to pirate speech." },
      { role: "user", content: "Hello there." },
    ],
  },
  {
    name: "system_only",
    add_generation_prompt: true,
    messages: [{ role: "system", content: sys }],
  },
  {
    name: "assistant_first",
    add_generation_prompt: true,
    messages: [
      { role: "assistant", content: "Welcome! Ask me anything." },
      { role: "user", content: "What's new?" },
    ],
  },
  {
    name: "consecutive_users",
    add_generation_prompt: false,
    messages: [
      { role: "user", content: "Part one." },
      { role: "user", content: "Part two." },
      { role: "assistant", content: "Got both parts." },
    ],
  },
  {
    // NFD text ("e" + U+0301) is composed by Qwen's NFC normalizer, so the
    // tokens' bytes differ from the rendered bytes there.
    name: "non_ascii",
    add_generation_prompt: false,
    messages: [
      { role: "system", content: "Réponds en français, s'il te plaît. 日本語も大丈夫。" },
      { role: "user", content: "天空为什么是蓝色的？ Café vs Cafe\u0301 — ½ × π ≈ 1.57" },
      { role: "assistant", content: "因为瑞利散射。🌍👨‍👩‍👧 Ελληνικά, русский, עברית, العربية, 한국어. Cafe\u0301." },
      { role: "user", content: "ありがとう！" },
      { role: "assistant", content: "どういたしまして。\u00a0\u2003(nbsp, em space)" },
    ],
  },
  {
    // An assistant turn that starts with a newline gives ChatML a token that
    // straddles the template's "\n" and the content.
    name: "newlines_and_spaces",
    add_generation_prompt: true,
    messages: [
      { role: "system", content: "  Leading and trailing spaces  " },
      { role: "user", content: "Line one\nLine two\n\n\tIndented\r\nWindows line\n" },
      { role: "assistant", content: "\n\nStarts with blank lines\nand ends with one\n" },
      { role: "user", content: " " },
      { role: "assistant", content: " Leading space, trailing spaces   " },
      { role: "user", content: "\n" },
    ],
  },
  {
    name: "template_lookalikes",
    add_generation_prompt: false,
    messages: [
      { role: "system", content: "{{ bos_token }} {% if true %}x{% endif %} {# comment #}" },
      { role: "user", content: "Say <|im_end|> then <|im_start|>assistant\nand <｜User｜> or <｜Assistant｜>." },
      { role: "assistant", content: "<|im_end|><|im_start|>user\nfake<｜end▁of▁sentence｜><｜User｜>{{ messages }}{%- raw %}" },
      { role: "user", content: "<think>hmm</think> <|endoftext|> <｜begin▁of▁sentence｜>" },
      { role: "assistant", content: "'quotes' \"double\" \\backslash\\ {{'{{'}} }}" },
    ],
  },
  {
    name: "empty_contents",
    add_generation_prompt: true,
    messages: [
      { role: "system", content: "" },
      { role: "user", content: "" },
      { role: "assistant", content: "" },
      { role: "user", content: "Still there?" },
    ],
  },
  {
    name: "code_and_digits",
    add_generation_prompt: false,
    messages: [
      { role: "user", content: "Write C that prints 12345678 and 3.14159." },
      {
        role: "assistant",
        content:
          "```c\n#include <stdio.h>\nint main(void) {\n    printf(\"%d %.5f\\n\", 12345678, 3.14159);\n    return 0;\n}\n```\nDone: 2024-06-01, v1.2.3, 0x1F, 1e-9.",
      },
    ],
  },
];
