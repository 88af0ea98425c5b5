// The chat page at GET / in headless Chromium (Debian's, driven by
// playwright-core): the API key typed in, a message typed and sent, the
// reply streamed into the page (several updates) and equal to the API's
// greedy reply for the same conversation, then a long second reply stopped
// with the stop button (the server cancels it and frees the slot). The
// screenshot goes to $TMP/serve-chat.png, and to SERVE_SCREENSHOT when set
// (scripts/serve-screenshot.sh regenerates docs/img/serve-chat.png so).
// SERVE_PAGE_URL: a server with a long context (the second reply must last);
// SERVE_PAGE_SYSTEM, SERVE_PAGE_QUESTION: the conversation (the script's
// model was taught one answer).
import fs from 'node:fs';
import { chromium } from 'playwright-core';
import { env, check, finish, auth } from './lib.mjs';

const url = process.env.SERVE_PAGE_URL ?? env.url;
const exe = process.env.CHROMIUM ?? '/usr/bin/chromium';
const metric = async (name) => {
  const text = await (await fetch(url + '/metrics', { headers: auth })).text();
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
};

const browser = await chromium.launch({ executablePath: exe, args: ['--disable-gpu'] });
const page = await browser.newPage({ viewport: { width: 1100, height: 640 } });
const errors = [];
let keyed = false; // before the key is typed, the page's /v1/models gets its 401
page.on('pageerror', (e) => errors.push(e.message));
page.on('console', (m) => keyed && m.type() === 'error' && errors.push(m.text()));
try {
  await page.goto(url + '/');
  check('page: the title', (await page.title()) === 'whale chat');
  await page.fill('#key', env.key);
  keyed = true;
  await page.dispatchEvent('#key', 'change');
  await page.waitForFunction(() => document.getElementById('model').textContent.length > 0, null, { timeout: 10000 });
  check('page: the model name from /v1/models', (await page.textContent('#model')) === env.model);
  const system = process.env.SERVE_PAGE_SYSTEM ?? 'You are a helpful whale.';
  const question = process.env.SERVE_PAGE_QUESTION ?? 'Hello! What can you tell me about the sea?';
  await page.fill('#system', system);
  await page.fill('#temperature', '0');
  // long enough that the reply arrives over several reads however fast the
  // server is (48 tokens once came in a single one)
  await page.fill('#max_tokens', '160');

  // record every change of the reply's text: a streamed reply arrives in several
  await page.evaluate(() => {
    window.updates = [];
    new MutationObserver(() => {
      const last = document.querySelectorAll('.m.assistant');
      if (last.length) window.updates.push(last[last.length - 1].textContent.length);
    }).observe(document.getElementById('log'), { subtree: true, childList: true, characterData: true });
  });
  await page.fill('#msg', question);
  await page.press('#msg', 'Enter');
  await page.waitForFunction(() => !document.getElementById('send').disabled &&
    document.querySelectorAll('.m.assistant').length === 1, null, { timeout: 30000 });
  const reply = await page.textContent('.m.assistant');
  const updates = await page.evaluate(() => window.updates.filter((n) => n > 0));
  check('page: the user message shown', (await page.textContent('.m.user')) === question);
  check('page: the reply streamed in (several updates, growing)', updates.length > 1 &&
        updates.every((n, i) => i === 0 || n >= updates[i - 1]), JSON.stringify(updates));
  const api = await (await fetch(url + '/v1/chat/completions', { method: 'POST',
    headers: { 'Content-Type': 'application/json', ...auth }, body: JSON.stringify({ model: env.model,
      messages: [...(system ? [{ role: 'system', content: system }] : []), { role: 'user', content: question }],
      temperature: 0, top_p: 0.9, max_tokens: 160 }) })).json();
  check('page: the reply is the API\'s greedy reply', reply === api.choices[0].message.content,
        JSON.stringify([reply, api.choices[0].message.content]));
  await page.waitForFunction(() => /tokens\/s/.test(document.getElementById('stat').textContent), null,
                             { timeout: 5000 });
  check('page: tokens/s shown', /tokens, [0-9.]+ tokens\/s/.test(await page.textContent('#stat')),
        await page.textContent('#stat'));
  const shot = await page.screenshot();
  fs.writeFileSync(`${env.tmp}/serve-chat.png`, shot);
  if (process.env.SERVE_SCREENSHOT) fs.writeFileSync(process.env.SERVE_SCREENSHOT, shot);
  check('page: a screenshot', shot.length > 10000 && shot.subarray(1, 4).toString() === 'PNG', shot.length);

  // a long second reply, stopped once it has begun
  const aborted = await metric('whale_requests_aborted_total');
  await page.fill('#max_tokens', '100000');
  await page.fill('#msg', 'Now tell me a very long story.');
  await page.press('#msg', 'Enter');
  await page.waitForFunction(() => {
    const a = document.querySelectorAll('.m.assistant');
    return a.length === 2 && a[1].textContent.length > 0;
  }, null, { timeout: 30000, polling: 5 });
  await page.click('#stop');
  await page.waitForFunction(() => !document.getElementById('send').disabled, null, { timeout: 10000 });
  const stopped = (await page.$$eval('.m.assistant', (a) => a[1].textContent)).length;
  let after = aborted;
  for (let i = 0; i < 100 && !(after > aborted && (await metric('whale_slots_busy')) === 0); i++) {
    await new Promise((r) => setTimeout(r, 50));
    after = await metric('whale_requests_aborted_total');
  }
  check('page: stop cancels the reply on the server and frees its slot',
        after === aborted + 1 && (await metric('whale_slots_busy')) === 0, `${aborted} -> ${after}`);
  await new Promise((r) => setTimeout(r, 300));
  check('page: the stopped reply no longer grows',
        (await page.$$eval('.m.assistant', (a) => a[1].textContent)).length === stopped);
  check('page: stop disabled, send enabled again', await page.isDisabled('#stop') && !(await page.isDisabled('#send')));

  // a server with adapters (SERVE_PAGE_ADAPTERS=1: the test's has one): the picker lists them, and a reply
  // picked from an adapter is that adapter's
  const picks = await page.$$eval('#pick option', (o) => o.map((x) => x.value));
  if (process.env.SERVE_PAGE_ADAPTERS === '1' && picks.length < 2) check('page: the picker lists the adapters', false, picks);
  if (picks.length > 1) {
    await page.reload(); // a new conversation (the key stays in the browser)
    await page.waitForFunction(() => document.querySelectorAll('#pick option').length > 1, null, { timeout: 10000 });
    await page.selectOption('#pick', picks[1]);
    await page.fill('#system', '');
    await page.fill('#temperature', '0');
    await page.fill('#max_tokens', '16');
    await page.fill('#msg', question);
    await page.press('#msg', 'Enter');
    await page.waitForFunction(() => !document.getElementById('send').disabled &&
      document.querySelectorAll('.m.assistant').length === 1, null, { timeout: 30000 });
    const ask = async (model) => (await (await fetch(url + '/v1/chat/completions', { method: 'POST',
      headers: { 'Content-Type': 'application/json', ...auth }, body: JSON.stringify({ model,
        messages: [{ role: 'user', content: question }], temperature: 0, top_p: 0.9, max_tokens: 16 }) })).json())
      .choices[0].message.content;
    const [mine, base] = [await ask(picks[1]), await ask(picks[0])];
    check(`page: the picker lists the adapters (${picks.join(', ')}); a reply from ${picks[1]} is its API reply`,
          picks[0] === env.model && (await page.textContent('.m.assistant')) === mine && mine !== base,
          JSON.stringify([await page.textContent('.m.assistant'), mine, base]));
  }
  check('page: no script errors', errors.length === 0, JSON.stringify(errors));
} finally {
  await browser.close();
}
finish('serve-page');
