// Drives the admin web UI in headless Chromium (Debian's `chromium`, through playwright-core),
// as server/tests/admin_ui.rs sets it up: log in, read the queues page, find a job by its
// idempotency key, read the rates' sparkline, requeue a dead letter, pause a queue, delete an
// empty queue, and check that a request without a session, with a bad CSRF token, with a
// tampered session cookie or from a key without the admin role is refused. Saves screenshots. Exits non-zero on failure.
import { chromium, request } from "playwright-core";
import assert from "node:assert/strict";

const args = JSON.parse(process.argv[2]);
const { base, apiKey, workerKey, deadId, keyedId, shots } = args;
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
  // A key of this server without the admin role is refused, saying which role it lacks.
  await page.goto(base + "/login");
  await page.fill("input[name=api_key]", workerKey);
  const refused = page.waitForResponse((r) => r.url() === base + "/login" && r.request().method() === "POST");
  await page.click("form.login button");
  assert.equal((await refused).status(), 403);
  assert.match(await page.textContent("main"), /lacks the role "admin"/);
  assert.equal((await page.context().cookies()).length, 0);
  await page.goto(base + "/login");
  await page.fill("input[name=api_key]", apiKey);
  await page.click("form.login button");
  assert.equal(new URL(page.url()).pathname, "/");

  // The session cookie is HttpOnly and SameSite=Strict, and holds no key.
  const [cookie] = await page.context().cookies();
  assert.equal(cookie.name, "sepp_session");
  assert.equal(cookie.httpOnly, true);
  assert.equal(cookie.sameSite, "Strict");
  assert.ok(!cookie.value.includes(apiKey), cookie.value);

  // Queues overview.
  const row = page.locator('tr[data-queue="mail"] td');
  assert.equal(await row.nth(1).textContent(), "2"); // ready
  assert.equal(await row.nth(4).textContent(), "1"); // dead letters
  // The last hour: an inline SVG sparkline and the last complete minute's four numbers.
  assert.equal(await row.nth(6).locator("svg.spark polyline").count() >= 1, true);
  assert.match(await row.nth(6).locator(".per-min").textContent(), /^\d+ \/ \d+ \/ \d+ \/ \d+$/);
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

  // Delete queue: offered only for an empty queue, refused with a bad CSRF token, and done
  // after the confirmation.
  await page.goto(base + "/queues/mail");
  assert.equal(await page.locator("#delete-queue").count(), 0);
  const badDelete = await page.request.post(base + "/queues/old/delete", {
    form: { csrf: "0".repeat(64) },
    maxRedirects: 0,
  });
  assert.equal(badDelete.status(), 403);
  await page.goto(base + "/queues/old");
  page.once("dialog", (d) => d.accept());
  await page.click("#delete-queue");
  await page.waitForURL(base + "/");
  assert.equal(await page.locator('tr[data-queue="old"]').count(), 0);
  assert.equal(await page.locator('tr[data-queue="mail"]').count(), 1);

  // A tampered cookie: the same session with its expiry moved out, or one digit of its
  // signature changed, opens nothing.
  const parts = cookie.value.split(".");
  const later = [parts[0], parts[1], String(Number(parts[2]) + 86_400_000), parts[3], parts[4]].join(".");
  const sig = parts[4];
  const flipped = [...parts.slice(0, 4), sig.slice(0, -1) + (sig.endsWith("0") ? "1" : "0")].join(".");
  for (const value of [later, flipped]) {
    const forged = await request.newContext({ extraHTTPHeaders: { cookie: `sepp_session=${value}` } });
    const get = await forged.get(base + "/", { maxRedirects: 0 });
    assert.equal(get.status(), 303, value);
    const post = await forged.post(base + "/queues/mail/resume", { form: { csrf: "x" }, maxRedirects: 0 });
    assert.equal(post.status(), 403, value);
    await forged.dispose();
  }
  // The untouched cookie still works the same way from another client.
  const same = await request.newContext({ extraHTTPHeaders: { cookie: `sepp_session=${cookie.value}` } });
  assert.equal((await same.get(base + "/", { maxRedirects: 0 })).status(), 200);
  await same.dispose();
  console.log("admin UI browser checks passed");
} finally {
  await browser.close();
}
