// Open WebUI in a real browser (Debian's chromium, headless, driven over the DevTools
// protocol by playwright-core, which downloads no browser) against `deepinfer serve`: for
// each model it picks the model in the selector, holds a conversation whose answers stream
// with a reasoning block, continues it (and checks the server's prefix cache was hit), stops
// a long answer (and checks the server aborted it), and sends an image.
//
//   node tools/webui_e2e.mjs WEBUI_URL SCREENSHOT MODEL=SERVER_URL...
//
// Each server is scripted (the hidden test hook --debug-force-output, see
// tools/clients_e2e.sh): any prompt gets "Let me think about the greeting.</think>Hello from
// deepinfer.", a prompt ending in " long story" a long answer (lines 1 to 799 of a story), a
// prompt ending with an image "The user sent a picture.</think>I see your picture.". The
// first model's conversation is kept as SCREENSHOT.
// playwright-core where tools/clients_e2e.sh installed it (PLAYWRIGHT_CORE: its index.mjs).
const { chromium } = await import(process.env.PLAYWRIGHT_CORE ?? 'playwright-core');

const [webui, screenshot, ...pairs] = process.argv.slice(2);
if (!webui || !screenshot || pairs.length === 0) {
  console.error('usage: node tools/webui_e2e.mjs WEBUI_URL SCREENSHOT MODEL=SERVER_URL...');
  process.exit(2);
}
const HELLO = 'Hello from deepinfer.';
const THOUGHT = 'Let me think about the greeting.';
const PICTURE = 'I see your picture.';
// Over 128 tokens (one cache block) by itself, so that the second turn reuses the first's
// cache even without the tool definitions Open WebUI puts before it.
const PARAGRAPH =
  'Here is some context for our chat. ' +
  Array.from({ length: 12 }, (_, i) => `Fact ${i + 1}: the number ${i + 1} squared is ${(i + 1) ** 2}.`).join(' ') +
  ' Say hello.';

function check(ok, what) {
  if (!ok) throw new Error(`Open WebUI: ${what}`);
  console.log(`  ok: ${what}`);
}

// One scrape of a server's /metrics: a reader of the first sample whose line starts with
// `name` (0 when none).
async function scrape(server) {
  const lines = (await (await fetch(`${server}/metrics`)).text()).split('\n');
  return (name) => {
    const line = lines.find((l) => l.startsWith(name));
    return line ? Number(line.split(' ').pop()) : 0;
  };
}

async function until(what, probe, ms = 60000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await probe()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`Open WebUI: timed out waiting for ${what}`);
}

// The server has finished everything Open WebUI asked of it (the answer and the background
// tasks left on, title generation).
async function idle(server) {
  await until('the server to go idle', async () => {
    const m = await scrape(server);
    return m('deepinfer:num_requests_running') === 0 && m('deepinfer:num_requests_waiting') === 0;
  });
}

const responses = (page) => page.locator('#response-content-container');

async function send(page, text) {
  await page.locator('#chat-input').click();
  await page.keyboard.insertText(text);
  await page.keyboard.press('Enter');
}

// Waits for the n-th answer (1-based) of the chat to read `text`, and returns its locator.
async function answer(page, n, text) {
  await until(`answer ${n} to read ${JSON.stringify(text)}`, async () =>
    (await responses(page).count()) >= n &&
    (await responses(page).nth(n - 1).innerText()).includes(text));
  return responses(page).nth(n - 1);
}

async function pickModel(page, model) {
  await page.locator('button[aria-label^="Selected model"]').first().click();
  const options = page.locator('[role=option]');
  const listed = await options.allInnerTexts();
  check(listed.some((t) => t.includes(model)), `the model list (${listed.join(', ')}) offers ${model}`);
  await options.filter({ hasText: model }).first().click();
  await until(`${model} to be selected`, async () =>
    (await page.locator(`button[aria-label="Selected model: ${model}"]`).count()) > 0);
}

// Turn 1: a streamed answer with a reasoning block that opens to the reasoning.
async function greet(page) {
  await send(page, PARAGRAPH);
  const first = await answer(page, 1, HELLO);
  const block = first.locator('button[aria-expanded]').first();
  check(/Thought for/.test(await block.innerText()), 'the answer has a collapsed reasoning block');
  await block.click();
  await until('the reasoning to show', async () => (await first.innerText()).includes(THOUGHT));
  check(true, `the reasoning block opens to "${THOUGHT}"`);
}

// Turn 2 continues the conversation; its prompt starts with turn 1's, so the server's prefix
// cache serves that part. (Open WebUI runs with its follow-up and tag tasks off, so the
// count is this request's own.)
async function continueChat(page, server) {
  const hits = 'deepinfer:prefix_cache_hits_total';
  const queries = 'deepinfer:prefix_cache_queries_total';
  await idle(server);
  const before = await scrape(server);
  await send(page, 'Say hello again.');
  await answer(page, 2, HELLO);
  await idle(server);
  const after = await scrape(server);
  const found = after(hits) - before(hits);
  const prompt = after(queries) - before(queries);
  check(found >= 128, `the follow-up took ${found} of its ${prompt} prompt tokens from the prefix cache`);
}

// Turn 3: a long answer streams (its text grows) until Stop; the server aborts it.
async function stopLongAnswer(page, server) {
  const aborted = 'deepinfer:request_success_total{finished_reason="abort"';
  await idle(server);
  const aborts = (await scrape(server))(aborted);
  await send(page, 'Now tell me a long story');
  const third = await answer(page, 3, 'Once upon a time');
  const lengths = [];
  for (let i = 0; i < 3; i++) {
    lengths.push((await third.innerText()).length);
    await page.waitForTimeout(300);
  }
  check(lengths[0] < lengths[1] && lengths[1] < lengths[2], `the answer streams (${lengths.join(' < ')} characters)`);
  await page.locator('button[aria-label="Stop"]').click();
  await until('the server to abort the request', async () => (await scrape(server))(aborted) > aborts, 10000);
  const stopped = (await third.innerText()).length;
  await page.waitForTimeout(1000);
  const after = await third.innerText();
  check(after.length === stopped && !after.includes('line 799'), `Stop ends the answer at ${stopped} characters, and the server aborted it`);
}

// Turn 4: an image from the file picker reaches the model as an image (the script answers
// only a prompt that ends with an image's span).
async function sendImage(page) {
  // A picture drawn by the browser: a red disc on blue.
  const png = Buffer.from(await page.evaluate(() => {
    const c = document.createElement('canvas');
    c.width = 96;
    c.height = 64;
    const g = c.getContext('2d');
    g.fillStyle = '#2050c0';
    g.fillRect(0, 0, 96, 64);
    g.fillStyle = '#e03020';
    g.beginPath();
    g.arc(48, 32, 24, 0, 2 * Math.PI);
    g.fill();
    return c.toDataURL('image/png').split(',')[1];
  }), 'base64');
  await page.locator('input[type=file][multiple]').first().setInputFiles({ name: 'picture.png', mimeType: 'image/png', buffer: png });
  await until('the image to upload', async () => (await page.locator('#message-input-container img').count()) > 0, 30000);
  await send(page, 'What is in this picture?');
  await answer(page, 4, PICTURE);
  check((await page.locator('#messages-container img').count()) > 1, 'the image shows in the conversation');
}

async function session(browser, model, server, shot) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 1200 } });
  await page.goto(webui);
  const go = page.getByText("Okay, Let's Go!");
  await go.waitFor({ timeout: 10000 }).catch(() => {});
  if (await go.count()) await go.click();
  console.log(`Open WebUI with ${model} (${server}):`);
  try {
    await pickModel(page, model);
    await greet(page);
    await continueChat(page, server);
    await stopLongAnswer(page, server);
    await sendImage(page);
  } catch (e) {
    // What the page showed, beside the screenshot's path, for the one reading the log.
    const failed = screenshot.replace(/\.png$/, '') + '-failed.png';
    await page.screenshot({ path: failed, fullPage: true });
    console.error(`the page at the failure: ${failed}`);
    throw e;
  }
  if (shot) {
    await idle(server);
    await page.screenshot({ path: shot });
  }
  await page.close();
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  // What a closed network needs: no background connections, no component updates.
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
try {
  for (const [i, pair] of pairs.entries()) {
    const [model, server] = pair.split('=');
    await session(browser, model, server, i === 0 ? screenshot : null);
  }
} finally {
  await browser.close();
}
console.log('Open WebUI e2e: all passed');
