// --drain-timeout 0 (the page server, SERVE_PAGE_URL, SERVE_PID4): SIGTERM
// cancels a running stream at once instead of waiting for it (its last
// chunk says finish_reason "cancelled"). serve.sh then
// checks that the server exited 0 and said why it cancelled.
import { env, check, finish, metric, auth } from './lib.mjs';

const url = process.env.SERVE_PAGE_URL, pid = Number(process.env.SERVE_PID4);
// 2,000 tokens take seconds on any machine; the signal goes as soon as the
// server's metrics show the stream running
const res = await fetch(url + '/v1/chat/completions', { method: 'POST', headers: auth,
  body: JSON.stringify({ model: env.model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2000,
                         ignore_eos: true, stream: true }) });
for (let i = 0; i < 500 && (await metric('whale_slots_busy', url)) !== 1; i++) await new Promise((r) => setTimeout(r, 10));
const t0 = Date.now();
process.kill(pid, 'SIGTERM');
const text = await res.text().catch(() => '(connection closed)');
const ms = Date.now() - t0;
check('--drain-timeout 0: the running stream ends at once, cancelled', res.status === 200 &&
      text.includes('"finish_reason":"cancelled"'), `${res.status} ${JSON.stringify(text.slice(-120))}`);
check('--drain-timeout 0: within seconds of SIGTERM', ms < 10000, `${ms} ms`);
finish('serve-drain');
