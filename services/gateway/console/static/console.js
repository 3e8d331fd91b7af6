// The specops console's script: calls the API with the session cookie and the CSRF header,
// follows event streams, draws the best-so-far chart. No framework; each block below wires the
// elements of one feature (found by data-testid) when the page has them.
"use strict";

(() => {
  const API = document.body.dataset.api;
  const byId = (testid, root = document) => root.querySelector(`[data-testid="${testid}"]`);

  function csrf() {
    const cookie = document.cookie.split("; ").find((c) => c.startsWith("specops_csrf="));
    return cookie ? decodeURIComponent(cookie.slice("specops_csrf=".length)) : "";
  }

  // A JSON call; a problem+json answer becomes an Error carrying its detail.
  async function call(method, path, body) {
    const response = await fetch(path, {
      method,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-Specops-CSRF": csrf() },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      const fields = (data.errors || []).map((e) => `${e.pointer.replace(/^#\//, "")}: ${e.detail}`);
      const error = new Error([data.detail || data.title || `HTTP ${response.status}`, ...fields].join("; "));
      error.status = response.status;
      throw error;
    }
    return { status: response.status, data };
  }

  function show(element, text) {
    element.textContent = text;
    element.hidden = false;
  }

  // --- live events --------------------------------------------------------------------------
  // A page is rendered with the events so far; this follows on after the last of them (the API's
  // Last-Event-ID), over fetch, and announces each new one as a `specops:event` on document.

  function parseEvent(block) {
    const event = { id: null, type: "message", data: "" };
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "id") event.id = Number(value);
      else if (field === "event") event.type = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return null;
    try {
      event.data = JSON.parse(data.join("\n"));
    } catch {
      event.data = {};
    }
    return event;
  }

  async function streamOnce(live, state) {
    const response = await fetch(live.dataset.stream, {
      credentials: "same-origin",
      headers: { Accept: "text/event-stream", "Last-Event-ID": String(state.after) },
    });
    // A refusal (401, 404) ends the following; an outage (503) is tried again.
    if (!response.ok || !response.body) return response.status >= 500;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return true;
      buffer = (buffer + value).replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = parseEvent(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
        if (!event) continue;
        if (event.id !== null) state.after = event.id;
        state.quiet = 0;
        document.dispatchEvent(new CustomEvent("specops:event", { detail: event }));
        if (state.reloadOn.has(event.type)) {
          window.location.reload();
          return false;
        }
      }
    }
  }

  async function follow(live) {
    const state = {
      after: Number(live.dataset.after || 0),
      reloadOn: new Set((live.dataset.reloadOn || "").split(" ").filter(Boolean)),
      quiet: 0,
    };
    // A stream that ends without news (a restart, an outage) is resumed a few times.
    while (state.quiet < 5) {
      state.quiet += 1;
      const again = await streamOnce(live, state).catch(() => true);
      if (!again) return;
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }

  const live = document.querySelector(".live[data-stream]");
  if (live && live.dataset.ended !== "true") follow(live);

  // The event log: one item per event.
  const log = byId("event-log");
  if (log) {
    document.addEventListener("specops:event", ({ detail }) => {
      const item = document.createElement("li");
      item.dataset.testid = "event-item";
      item.dataset.seq = String(detail.id);
      const time = document.createElement("time");
      time.textContent = String(detail.data.occurred_at || "").slice(11, 19);
      const code = document.createElement("code");
      code.textContent = detail.type;
      item.append(time, " ", code);
      log.append(item);
      log.scrollTop = log.scrollHeight;
    });
  }

  // A status badge follows the events that name the status they lead to.
  const STATUS_AFTER = {
    "run.queued": "queued",
    "run.running": "running",
    "run.predicted": "predicted",
    "run.completed": "completed",
    "run.failed": "failed",
    "tune.started": "running",
  };
  const badge = document.querySelector("[data-live-status]");
  if (badge) {
    document.addEventListener("specops:event", ({ detail }) => {
      const status = STATUS_AFTER[detail.type];
      if (status) {
        badge.textContent = status;
        badge.className = `state state-${status}`;
      }
    });
  }

  // --- apply and copy -------------------------------------------------------------------------

  const applyForm = document.querySelector("form[data-apply]");
  if (applyForm) {
    applyForm.addEventListener("submit", async (submit) => {
      submit.preventDefault();
      const error = byId("apply-error");
      error.hidden = true;
      try {
        const { data } = await call("POST", applyForm.dataset.apply, { engine: byId("apply-engine").value });
        show(byId("apply-flags"), data.cli_args.join(" "));
        byId("apply-flags").closest(".flags").hidden = false;
        const copy = byId("copy-flags");
        copy.textContent = "Copy";
        copy.classList.remove("copied");
        delete copy.dataset.state;
      } catch (err) {
        show(error, err.message);
      }
    });
  }

  async function copyText(text, source) {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return;
    }
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    document.execCommand("copy");
    selection.removeAllRanges();
  }

  for (const button of document.querySelectorAll("button[data-copy]")) {
    button.addEventListener("click", async () => {
      const source = document.getElementById(button.dataset.copy);
      await copyText(source.textContent, source);
      button.textContent = "Copied";
      button.classList.add("copied");
      button.dataset.state = "copied";
    });
  }

  // --- new run: the form, the wizard, inference from sample prompts ----------------------------

  const newRun = byId("new-run-form");
  if (newRun) {
    const select = byId("fingerprint");
    const wizard = byId("wizard");
    const table = JSON.parse(wizard.dataset.table);
    const answered = byId("wizard-result");
    wizard.addEventListener("change", () => {
      const answers = ["wizard-q1", "wizard-q2", "wizard-q3"].map((q) => {
        const checked = byId(q).querySelector("input:checked");
        return checked ? checked.value : null;
      });
      if (answers.includes(null)) return;
      select.value = table[answers.join("/")];
      show(answered, `Fingerprint: ${select.value}`);
    });

    byId("infer-fingerprint").addEventListener("click", async () => {
      const result = byId("infer-result");
      try {
        const { data } = await call("POST", "/ui/fingerprint", { prompts: byId("sample-prompts").value });
        select.value = data.fingerprint;
        show(result, `Looks like ${data.fingerprint} (confidence ${data.confidence}; runner-up ${data.runner_up})`);
      } catch (err) {
        show(result, err.message);
      }
    });

    newRun.addEventListener("submit", async (submit) => {
      submit.preventDefault();
      const error = byId("form-error");
      error.hidden = true;
      const value = (testid) => byId(testid).value;
      const body = {
        target: { model_ref: value("model-ref"), gpu: value("gpu"), engine: value("engine") },
        workload: { fingerprint: value("fingerprint") },
        mode: value("mode"),
        goal: { quality_gate: value("quality-gate") },
      };
      try {
        const { data } = await call("POST", `${API}/runs`, body);
        window.location.assign(`/ui/runs/${data.id}`);
      } catch (err) {
        show(error, err.message);
      }
    });
  }

  // --- tune: the best-so-far chart and the trials table --------------------------------------

  const SVG = "http://www.w3.org/2000/svg";
  function svg(name, attributes, text) {
    const element = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
    if (text !== undefined) element.textContent = text;
    return element;
  }

  // Each ended trial is a point (a failed one hollow, on the floor); the line is the best so far.
  function drawChart(chart, points) {
    const [W, H, left, right, top, bottom] = [600, 260, 52, 16, 16, 36];
    chart.querySelectorAll(".plot").forEach((node) => node.remove());
    const plot = svg("g", { class: "plot" });
    const values = points.flatMap((p) => [p.value, p.best_value]).filter((v) => v !== null);
    let lo = values.length ? Math.min(...values) : 1;
    let hi = values.length ? Math.max(...values) : 2;
    const pad = Math.max((hi - lo) * 0.1, 0.05);
    lo -= pad;
    hi += pad;
    const lastTrial = Math.max(1, ...points.map((p) => p.trial));
    const x = (trial) => left + (trial / lastTrial) * (W - left - right);
    const y = (value) => (value === null ? H - bottom : top + ((hi - value) / (hi - lo)) * (H - top - bottom));
    plot.append(
      svg("line", { class: "axis", x1: left, y1: H - bottom, x2: W - right, y2: H - bottom }),
      svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: H - bottom }),
      svg("text", { x: 4, y: top + 10 }, `${hi.toFixed(2)}×`),
      svg("text", { x: 4, y: H - bottom }, `${lo.toFixed(2)}×`),
      svg("text", { x: left, y: H - bottom + 16, "text-anchor": "middle" }, "0"),
      svg("text", { x: W - right, y: H - bottom + 16, "text-anchor": "end" }, String(lastTrial)),
      svg("text", { x: W / 2, y: H - 8, "text-anchor": "middle" }, "trial"),
    );
    const best = points.filter((p) => p.best_value !== null);
    if (best.length) {
      // A step line: the best holds until a trial beats it.
      const path = best.map((p, i) => (i ? `H${x(p.trial)} V${y(p.best_value)}` : `M${x(p.trial)},${y(p.best_value)}`)).join(" ");
      plot.append(svg("path", { class: "best", d: path }));
    }
    for (const p of points) {
      const circle = svg("circle", {
        "data-testid": "chart-point",
        "data-trial": p.trial,
        class: p.value === null ? "failed" : "complete",
        cx: x(p.trial),
        cy: y(p.value),
        r: 5,
      });
      const label = p.value === null ? "failed" : `${p.value.toFixed(3)}`;
      circle.append(svg("title", {}, `trial ${p.trial}: ${label}`));
      plot.append(circle);
    }
    chart.append(plot);
  }

  const chart = byId("best-so-far-chart");
  if (chart) {
    const points = JSON.parse(chart.dataset.curve);
    drawChart(chart, points);
    const trials = document.querySelector("tbody[data-trials]");
    document.addEventListener("specops:event", ({ detail }) => {
      if (detail.type !== "tune.trial_completed") return;
      const { point, result } = detail.data.payload;
      if (points.some((p) => p.trial === point.trial)) return;
      points.push(point);
      points.sort((a, b) => a.trial - b.trial);
      drawChart(chart, points);
      const row = document.createElement("tr");
      row.dataset.testid = "trial-row";
      row.dataset.trial = String(result.trial);
      const speed =
        result.speedup === null || result.speedup === undefined
          ? "—"
          : `${result.speedup.toFixed(2)} ± ${(result.speedup_stdev ?? 0).toFixed(2)}×`;
      const cells = [
        String(result.trial),
        result.candidate.family,
        `k=${result.candidate.k}`,
        result.state,
        speed,
        result.value === null || result.value === undefined ? "—" : result.value.toFixed(3),
        result.error_message || "",
      ];
      for (const text of cells) {
        const cell = document.createElement("td");
        cell.textContent = text;
        row.append(cell);
      }
      trials.append(row);
    });
  }

  // --- heads: training progress, lifecycle buttons ---------------------------------------------

  const progress = byId("train-progress");
  if (progress) {
    document.addEventListener("specops:event", ({ detail }) => {
      if (detail.type !== "head.epoch_completed") return;
      const epoch = detail.data.payload.epoch;
      const bar = progress.querySelector("progress");
      bar.value = epoch.epoch;
      const loss = epoch.train_loss === null ? "—" : epoch.train_loss.toFixed(3);
      progress.querySelector("[data-progress-text]").textContent = `epoch ${epoch.epoch} of ${bar.max}, loss ${loss}`;
    });
  }

  for (const button of document.querySelectorAll("button[data-move]")) {
    button.addEventListener("click", async () => {
      const error = byId("transition-error");
      error.hidden = true;
      const rationale = byId("rationale");
      const given = rationale ? rationale.value.trim() : "";
      if (button.dataset.rationaleRequired === "true" && !given) {
        // The API would refuse it (422); say so without the round trip.
        show(error, `Moving a head to ${button.dataset.move} needs a rationale.`);
        rationale.focus();
        return;
      }
      const body = { to: button.dataset.move };
      if (given) body.rationale = given;
      try {
        await call("POST", button.dataset.url, body);
        window.location.reload();
      } catch (err) {
        show(error, err.message);
      }
    });
  }

  // --- security policy --------------------------------------------------------------------------

  const policy = byId("security-form");
  if (policy) {
    policy.addEventListener("submit", async (submit) => {
      submit.preventDefault();
      const saved = byId("security-saved");
      const error = byId("security-error");
      saved.hidden = true;
      error.hidden = true;
      const budget = byId("gpu-budget-s").value.trim();
      const body = {
        tier: byId("tier").value,
        jitter: { mode: byId("jitter-mode").value, interval_ms: Number(byId("jitter-interval-ms").value) },
        speculation_opt_out: byId("opt-out").checked,
        gpu_budget_s: budget === "" ? null : Number(budget),
      };
      try {
        const { status: code, data } = await call("PUT", `${API}/security/policy`, body);
        show(saved, code === 200 ? `Saved: version ${data.version}.` : "Asked for; the security service applies it shortly.");
      } catch (err) {
        show(error, err.message);
      }
    });
  }
})();
