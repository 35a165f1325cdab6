// Drives the admin web UI in headless Chromium (Debian's `chromium`, through playwright-core),
// as server/tests/admin_ui.rs sets it up: log in, read the queues page, find a job by its
// idempotency key, requeue a dead letter, pause a queue, and check that a request without a
// session or with a bad CSRF token is refused. Saves screenshots. Exits non-zero on failure.
import { chromium, request } from "playwright-core";
import assert from "node:assert/strict";

const args = JSON.parse(process.argv[2]);
const { base, apiKey, deadId, keyedId, shots } = args;
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 640 } });
  page.setDefaultTimeout(10_000);

  // Every page asks for a login first; a wrong key is refused.
  await page.goto(base + "/");
  assert.equal(new URL(page.url()).pathname, "/login");
  await page.fill("input[name=api_key]", "not-a-key");
  await page.click("form.login button");
  assert.match(await page.textContent("main"), /not an API key/);
  await page.goto(base + "/login");
  await page.fill("input[name=api_key]", apiKey);
  await page.click("form.login button");
  assert.equal(new URL(page.url()).pathname, "/");

  // Queues overview.
  const row = page.locator('tr[data-queue="mail"] td');
  assert.equal(await row.nth(1).textContent(), "2"); // ready
  assert.equal(await row.nth(4).textContent(), "1"); // dead letters
  if (shots) await page.screenshot({ path: `${shots}/admin-ui-queues.png` });

  // Find a job by its idempotency key.
  await page.fill("header input[name=q]", "mail/order-1");
  await page.click("header button");
  assert.equal(new URL(page.url()).pathname, `/jobs/${keyedId}`);
  assert.match(await page.textContent("#job"), /order-1/);
  if (shots) await page.screenshot({ path: `${shots}/admin-ui-job.png` });

  // Jobs of a queue by state.
  await page.goto(base + "/queues/mail?state=ready");
  assert.equal(await page.locator("#jobs tbody tr").count(), 2);
  if (shots) await page.screenshot({ path: `${shots}/admin-ui-jobs.png` });

  // Dead letters: requeue one.
  await page.goto(base + "/dead-letters");
  const dl = page.locator(`tr[data-job="${deadId}"]`);
  assert.match(await dl.textContent(), /bad address/);
  if (shots) await page.screenshot({ path: `${shots}/admin-ui-dead-letters.png` });
  await dl.locator("button.requeue").click();
  await page.waitForURL(base + "/dead-letters");
  assert.equal(await page.locator(`tr[data-job="${deadId}"]`).count(), 0);

  // Pause the queue.
  await page.goto(base + "/queues/mail");
  await page.click("#pause");
  await page.waitForSelector(".badge.paused");
  assert.equal(await page.locator("#resume").count(), 1);

  // Refusals: a bad CSRF token with the session, and no session at all.
  const bad = await page.request.post(base + "/queues/mail/resume", {
    form: { csrf: "0".repeat(64) },
    maxRedirects: 0,
  });
  assert.equal(bad.status(), 403);
  const anon = await request.newContext();
  const none = await anon.post(base + "/queues/mail/resume", { form: { csrf: "x" }, maxRedirects: 0 });
  assert.equal(none.status(), 403);
  const nonePage = await anon.get(base + "/dead-letters", { maxRedirects: 0 });
  assert.equal(nonePage.status(), 303);
  await anon.dispose();
  console.log("admin UI browser checks passed");
} finally {
  await browser.close();
}
