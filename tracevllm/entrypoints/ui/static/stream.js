// Reading the engine's event stream, GET /v1/engine/events: Server-Sent Events, one JSON message
// each ("data: {...}\n\n"). Read with fetch rather than EventSource, which cannot send the
// Authorization header a server started with --api-key wants: on a 401 the page asks for the key
// (kept for this tab only) and connects again. After the stream ends (the server stopped, or it
// dropped this page for falling behind) it connects again, and the new stream's Hello starts afresh.

const RETRY_MS = 2000;
const KEY = 'tracevllm-api-key';

export async function follow(url, onMessage, onStatus, askKey) {
  for (;;) {
    try {
      const key = sessionStorage.getItem(KEY);
      const response = await fetch(url, {cache: 'no-store', headers: key ? {Authorization: `Bearer ${key}`} : {}});
      if (response.status === 401) {
        onStatus('needs the API key');
        sessionStorage.setItem(KEY, await askKey());
        continue;
      }
      if (!response.ok) throw new Error(`${url} answered HTTP ${response.status}`);
      onStatus('connected');
      await readEvents(response.body, onMessage);
      onStatus('the stream ended; connecting again');
    } catch (error) {
      onStatus(`not connected (${error.message}); trying again`);
    }
    await new Promise(resolve => setTimeout(resolve, RETRY_MS));
  }
}

async function readEvents(body, onMessage) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    const blocks = (pending + value).split('\n\n');
    pending = blocks.pop();  // an event cut by the chunk's end waits for the rest
    for (const block of blocks) {
      const data = block.split('\n').filter(line => line.startsWith('data:')).map(line => line.slice(5).trimStart());
      if (data.length) onMessage(JSON.parse(data.join('\n')));  // a line starting ':' is a comment
    }
  }
}
