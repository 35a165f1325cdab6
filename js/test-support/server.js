// Starts the real `sepp` server binary for the tests: a temporary config with
// `listen_addr = "127.0.0.1:0"` and a temporary data directory, then the address from the
// readiness line `sepp listening on ADDR`. A missing binary fails the suite (it never skips).
//
// The binary: $SEPP_TEST_SERVER_BIN, else <repo>/target/debug/sepp ($CARGO_TARGET_DIR respected).

import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** The server binary the tests run. */
export function serverBin() {
  if (process.env.SEPP_TEST_SERVER_BIN) return resolve(process.env.SEPP_TEST_SERVER_BIN);
  const target = process.env.CARGO_TARGET_DIR
    ? resolve(repo, process.env.CARGO_TARGET_DIR)
    : join(repo, "target");
  return join(target, "debug", "sepp");
}

/**
 * Starts a server. `server` and `storage` are extra lines of those sections; `extraToml` is
 * appended (`[auth]`, `[limits]`, `[[queues]]`).
 * @param {{ server?: string, storage?: string, extraToml?: string, timeoutMs?: number }} [options]
 */
export async function startServer({
  server = "",
  storage = "",
  extraToml = "",
  timeoutMs = 20_000,
} = {}) {
  const dir = await mkdtemp(join(tmpdir(), "sepp-js-test-"));
  const config = join(dir, "sepp.toml");
  await writeFile(
    config,
    [
      "[server]",
      'listen_addr = "127.0.0.1:0"',
      `db_path = ${JSON.stringify(join(dir, "data"))}`,
      server,
      "",
      "[storage]",
      'persist_mode = "buffer"',
      storage,
      "",
      extraToml,
      "",
    ].join("\n"),
  );
  // The server reads SEPP_SECTION__FIELD overrides and warns about other SEPP_ variables (those
  // of test rigs, SEPP_TEST_*, aside): the child gets none but SEPP_LOG, so that an override
  // left in the developer's shell does not change the server under test.
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.startsWith("SEPP_") || k === "SEPP_LOG"),
  );
  env.SEPP_LOG ??= "warn";
  const bin = serverBin();
  const child = spawn(bin, ["--config", config], { env, stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk) => {
    stderr = (stderr + chunk).slice(-8192);
  });
  const exited = once(child, "exit").then(([code, signal]) => ({ code, signal }));

  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
    await rm(dir, { recursive: true, force: true });
  };

  try {
    const lines = createInterface({ input: child.stdout });
    const first = once(lines, "line").then(([line]) => line);
    const failed = Promise.race([
      once(child, "error").then(([e]) => {
        throw new Error(`cannot start ${bin}: ${e.message} (build it with \`cargo build --bin sepp\`)`);
      }),
      exited.then(({ code, signal }) => {
        throw new Error(`${bin} exited (${code ?? signal}) before listening:\n${stderr}`);
      }),
    ]);
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`${bin} did not print its address in ${timeoutMs} ms:\n${stderr}`)),
        timeoutMs,
      );
    });
    const line = await Promise.race([first, failed, timeout]).finally(() => clearTimeout(timer));
    const match = /^sepp listening on (\S+)$/.exec(line);
    if (!match) throw new Error(`unexpected first line from ${bin}: ${JSON.stringify(line)}`);
    // Keep reading stdout so the server never blocks on a full pipe.
    child.stdout.resume();
    return { url: `http://${match[1]}`, addr: match[1], stop, stderr: () => stderr };
  } catch (e) {
    await stop();
    throw e;
  }
}
