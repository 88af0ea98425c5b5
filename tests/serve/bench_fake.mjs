// A server that lies to bench_serve (tests/cli/serve.sh): the model named
// "bad" gets an event that is not JSON, "big" 17 MB that never end an event.
// Prints its address, then serves until killed.
import http from 'node:http';

const server = http.createServer((req, res) => {
  let body = '';
  req.on('data', (d) => (body += d));
  req.on('end', () => {
    const model = JSON.parse(body || '{}').model;
    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
    if (model === 'bad') return res.end('data: {not json\n\n');
    const mb = Buffer.alloc(1 << 20, 'a');
    let left = 17;
    const more = () => {
      while (left > 0) {
        left--;
        if (!res.write(mb)) return res.once('drain', more);
      }
      res.end();
    };
    res.on('error', () => {}); // the client hangs up first
    more();
  });
});
server.listen(0, '127.0.0.1', () => console.log(`http://127.0.0.1:${server.address().port}`));
