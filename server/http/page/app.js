// voxpool's page: vanilla JavaScript, no build step, no dependencies. It talks only to the
// server that served it (same origin): /health, /v1/models, /v1/audio/{voices,speech,
// transcriptions,vad} and the WebSocket /v1/audio/vad/live. The live view polls /v1/models
// and draws each model the way the simulator's timeline does (sim/timeline.py): a management
// lane (the model's state), one lane per slot (busy or idle) and the queue depth, over the
// last 15 s, 60 s or 5 min.
"use strict";

const POLL_MS = 250;
const KEEP_S = 300; // the longest window: older samples are dropped
const TICKS = { 15: 5, 60: 10, 300: 60 }; // window -> seconds between ticks
const KEEP_REQUESTS = 12;
const BUSY = "#43a047";
const TEXT_SEGMENT = "#90caf9";
const LANE_BG = "#f5f5f5";
const STATE_COLOURS = {
  loading: "#1565c0",
  ready: "#cfd8dc",
  reconfiguring: "#bbdefb",
  unloading: "#6d4c41",
};
const QUEUE_COLOURS = ["#1e88e5", "#8e24aa", "#00897b", "#f4511e", "#6d4c41", "#c0ca33", "#3949ab", "#d81b60"];
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);

function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  if (parent) parent.appendChild(el);
  return el;
}

function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
}

function seconds(s) {
  return s < 10 ? `${s.toFixed(2)} s` : `${s.toFixed(1)} s`;
}

// Each speech or transcription run is numbered on its status line (data-run), so a reader
// can tell this run's final state (data-state: busy, then ok or error) from the previous one's.
function nextRun(el) {
  el.dataset.run = String(Number(el.dataset.run || 0) + 1);
}

function say(el, text, state) {
  el.textContent = text;
  el.classList.toggle("error", state === "error");
  el.dataset.state = state || "ok";
}

// ------------------------------------------------------------------ requests
class ApiFailure extends Error {
  constructor(message, status, requestId) {
    super(message);
    this.status = status;
    this.requestId = requestId;
  }
}

function describe(err, what) {
  if (err instanceof ApiFailure && err.status) {
    return `${what}: ${err.message} (HTTP ${err.status}, request id ${err.requestId})`;
  }
  return `${what}: ${err.message}`;
}

function logRequest(label, status, ms, requestId) {
  const body = $("request-log").tBodies[0];
  const row = body.insertRow(0);
  const cells = [new Date().toLocaleTimeString(), label, String(status), ms.toFixed(0), requestId];
  cells.forEach((text, i) => {
    const cell = row.insertCell();
    cell.textContent = text;
    if (i === 2 && !(status >= 200 && status < 400)) cell.className = "bad";
    if (i === 4) cell.className = "id";
  });
  while (body.rows.length > KEEP_REQUESTS) body.deleteRow(-1);
}

// One API call, listed in "Requests from this page" with its X-Request-Id. Resolves to
// {resp, id} for a 2xx; rejects with an ApiFailure carrying the server's own error message.
async function call(method, path, init) {
  const label = `${method} ${path.split("?")[0]}`;
  const t0 = performance.now();
  let resp;
  try {
    resp = await fetch(path, { method, ...init });
  } catch (err) {
    logRequest(label, "failed", performance.now() - t0, "-");
    throw new ApiFailure(`the server is unreachable (${err.message})`, 0, null);
  }
  const id = resp.headers.get("X-Request-Id") || "-";
  logRequest(label, resp.status, performance.now() - t0, id);
  if (!resp.ok) {
    let message = resp.statusText || "request failed";
    try {
      const body = await resp.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch (_) {
      // not JSON: keep the status text
    }
    throw new ApiFailure(message, resp.status, id);
  }
  return { resp, id };
}

const objectUrls = new WeakMap();

function setAudio(el, blob) {
  const old = objectUrls.get(el);
  if (old) URL.revokeObjectURL(old);
  const url = URL.createObjectURL(blob);
  objectUrls.set(el, url);
  el.dataset.bytes = String(blob.size);
  el.src = url;
}

// ------------------------------------------------------------------ model pickers
const selects = { tts: "tts-model", asr: "asr-model", vad: "vad-model" };

function fillSelects(rows) {
  for (const [task, id] of Object.entries(selects)) {
    const sel = $(id);
    const ids = rows.filter((r) => r.task === task).map((r) => r.id);
    const have = Array.from(sel.options, (o) => o.value);
    if (ids.join("\n") === have.join("\n")) continue;
    const keep = sel.value;
    clear(sel);
    for (const modelId of ids) sel.add(new Option(modelId, modelId));
    if (ids.includes(keep)) sel.value = keep;
    if (task === "tts") loadVoices();
  }
  $("speak-button").disabled = $("tts-model").options.length === 0;
  const canListen = $("asr-model").options.length + $("vad-model").options.length > 0;
  $("audio-file").disabled = !canListen;
  $("record-button").disabled = !canListen;
}

async function loadVoices() {
  const model = $("tts-model").value;
  const sel = $("tts-voice");
  if (!model) return;
  try {
    const { resp } = await call("GET", `/v1/audio/voices?model=${encodeURIComponent(model)}`);
    const voices = (await resp.json()).voices || [];
    const keep = sel.value;
    clear(sel);
    sel.add(new Option("default", ""));
    for (const v of voices) sel.add(new Option(v, v));
    if (voices.includes(keep)) sel.value = keep;
  } catch (err) {
    say($("speak-status"), describe(err, "voices"), "error");
  }
}

// ------------------------------------------------------------------ live voice activity
// The microphone at 16 kHz (the AudioContext resamples it), as 16-bit PCM over a WebSocket to
// /v1/audio/vad/live; each 32 ms chunk's probability comes back and is drawn over the last
// 10 s, with the speech start/end events. Stop sends {"type": "end"}: the server answers with
// the summary (the offline route's segments) and closes 1000. The status line says how the
// socket closed (data-close) and how many chunks came back (data-chunks).
const LIVE_CHUNKS = 312; // 10 s of 32 ms chunks drawn
let liveRun = null;

function fillLiveModels(rows) {
  const sel = $("live-model");
  const ids = rows.filter((r) => r.task === "vad" && r.batching).map((r) => r.id);
  if (ids.join("\n") !== Array.from(sel.options, (o) => o.value).join("\n")) {
    const keep = sel.value;
    clear(sel);
    for (const modelId of ids) sel.add(new Option(modelId, modelId));
    if (ids.includes(keep)) sel.value = keep;
  }
  if (!liveRun) $("live-button").disabled = ids.length === 0;
}

function drawLive(probs) {
  const el = $("live-svg");
  clear(el);
  svg("rect", { x: 0, y: 0, width: 560, height: 48, fill: LANE_BG }, el);
  const shown = probs.slice(-LIVE_CHUNKS);
  const w = 560 / LIVE_CHUNKS;
  shown.forEach((p, i) => {
    const h = Math.max(1, p * 44);
    svg("rect", { x: i * w, y: 46 - h, width: Math.max(w, 1), height: h, fill: p >= 0.5 ? BUSY : TEXT_SEGMENT }, el);
  });
}

function liveEvent(text) {
  const list = $("live-events");
  const item = document.createElement("li");
  item.textContent = text;
  list.appendChild(item);
}

async function toggleLive() {
  if (liveRun) {
    stopLiveAudio(liveRun);
    if (liveRun.ws.readyState === WebSocket.OPEN) liveRun.ws.send(JSON.stringify({ type: "end" }));
    $("live-button").disabled = true; // until the server closes
    say($("live-status"), "finishing…", "busy");
    return;
  }
  const status = $("live-status");
  const model = $("live-model").value;
  nextRun(status);
  status.dataset.chunks = "0";
  delete status.dataset.close;
  clear($("live-events"));
  say(status, "opening the microphone…", "busy");
  let media;
  try {
    media = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
  } catch (err) {
    say(status, `microphone: ${err.message} (a browser gives it only to a secure page)`, "error");
    return;
  }
  const context = new AudioContext({ sampleRate: 16000 });
  const source = context.createMediaStreamSource(media);
  const node = context.createScriptProcessor(4096, 1, 1);
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/v1/audio/vad/live?model=${encodeURIComponent(model)}`);
  ws.binaryType = "arraybuffer";
  const run = { ws, media, context, source, node, probs: [], error: null, done: null };
  liveRun = run;
  $("live-button").textContent = "Stop";
  ws.onopen = () => {
    node.onaudioprocess = (event) => {
      const input = event.inputBuffer.getChannelData(0);
      const pcm = new Int16Array(input.length);
      for (let i = 0; i < input.length; i++) {
        const v = Math.max(-1, Math.min(1, input[i]));
        pcm[i] = v < 0 ? v * 32768 : v * 32767;
      }
      if (ws.readyState === WebSocket.OPEN) ws.send(pcm.buffer);
    };
    source.connect(node);
    node.connect(context.destination);
    say(status, `listening (${model})…`, "busy");
  };
  ws.onmessage = (event) => {
    const message = JSON.parse(event.data);
    if (message.type === "vad.probabilities") {
      run.probs.push(...message.probabilities);
      status.dataset.chunks = String(run.probs.length);
      drawLive(run.probs);
    } else if (message.type === "vad.speech.start" || message.type === "vad.speech.end") {
      liveEvent(`${message.type.slice(11)} at ${seconds(message.time)}`);
    } else if (message.type === "vad.done") {
      run.done = message;
    } else if (message.type === "error") {
      run.error = message.error.message;
    }
  };
  ws.onclose = (event) => {
    stopLiveAudio(run);
    liveRun = null;
    status.dataset.close = String(event.code);
    $("live-button").textContent = "Start";
    $("live-button").disabled = $("live-model").options.length === 0;
    if (event.code === 1000 && run.done) {
      const segments = run.done.segments.map((s) => `${s.start.toFixed(2)}–${s.end.toFixed(2)} s`);
      say(status, `${seconds(run.done.duration)} heard, ${run.done.chunks} chunks; speech: ${segments.join(", ") || "none"}`, "ok");
    } else {
      let why = run.error || event.reason || "the server refused the connection or it was lost";
      try {
        why = JSON.parse(event.reason).message;
      } catch (_) {
        // a plain reason (or none): keep it
      }
      say(status, `live voice activity: ${why} (close ${event.code})`, "error");
    }
  };
}

function stopLiveAudio(run) {
  run.node.onaudioprocess = null;
  try {
    run.source.disconnect();
    run.node.disconnect();
  } catch (_) {
    // never connected (the socket did not open)
  }
  for (const track of run.media.getTracks()) track.stop();
  run.context.close().catch(() => {});
}

// ------------------------------------------------------------------ speak
async function speak() {
  const status = $("speak-status");
  const button = $("speak-button");
  const text = $("tts-text").value.trim();
  if (!text) {
    say(status, "type some text to speak first", "error");
    return;
  }
  const body = { model: $("tts-model").value, input: text, response_format: "wav" };
  if ($("tts-voice").value) body.voice = $("tts-voice").value;
  button.disabled = true;
  nextRun(status);
  say(status, "synthesizing…", "busy");
  try {
    const { resp, id } = await call("POST", "/v1/audio/speech", {
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const blob = await resp.blob();
    const wall = Number(resp.headers.get("X-Voxpool-Wall-Ms"));
    const audioMs = Number(resp.headers.get("X-Voxpool-Audio-Duration-Ms"));
    const audio = $("speech-audio");
    setAudio(audio, blob);
    say(status, `${seconds(audioMs / 1000)} of speech in ${wall.toFixed(0)} ms · ${id}`, "ok");
    audio.play().catch(() => {}); // a browser may refuse to autoplay: the controls are there
  } catch (err) {
    say(status, describe(err, "speech"), "error");
  } finally {
    button.disabled = $("tts-model").options.length === 0;
  }
}

// ------------------------------------------------------------------ transcribe
function form(blob, name, fields) {
  const data = new FormData();
  data.append("file", blob, name);
  for (const [key, value] of Object.entries(fields)) data.append(key, value);
  return data;
}

async function postJson(path, blob, name, fields) {
  const { resp, id } = await call("POST", path, { body: form(blob, name, fields) });
  return { json: await resp.json(), id };
}

async function transcribe(blob, name) {
  const status = $("listen-status");
  const transcript = $("transcript");
  setAudio($("input-audio"), blob);
  transcript.textContent = "";
  delete transcript.dataset.state;
  clear($("vad-segments"));
  clear($("segments-svg"));
  nextRun(status);
  say(status, `transcribing ${name} (${(blob.size / 1024).toFixed(0)} KiB)…`, "busy");
  const asrModel = $("asr-model").value;
  const vadModel = $("vad-model").value;
  const none = Promise.resolve(null);
  const [asr, vad] = await Promise.allSettled([
    asrModel
      ? postJson("/v1/audio/transcriptions", blob, name, { model: asrModel, response_format: "verbose_json" })
      : none,
    vadModel ? postJson("/v1/audio/vad", blob, name, { model: vadModel }) : none,
  ]);
  const problems = [];
  const done = [];
  let asrJson = null;
  if (asr.status === "fulfilled" && asr.value) {
    asrJson = asr.value.json;
    transcript.textContent = asrJson.text || "(no words recognised)";
    transcript.dataset.state = "ok";
    done.push(`transcript ${asr.value.id}`);
  } else if (asr.status === "rejected") {
    problems.push(["transcription", asr.reason]);
  }
  if (vad.status === "fulfilled" && vad.value) {
    drawSegments(vad.value.json, asrJson);
    done.push(`segments ${vad.value.id}`);
  } else if (vad.status === "rejected") {
    problems.push(["voice activity", vad.reason]);
    if (asrJson) drawSegments(null, asrJson);
  }
  if (problems.length) say(status, problemText(problems), "error");
  else say(status, `done: ${done.join(", ")}`, "ok");
}

// Failures as one line; the same server message for both requests is said once.
function problemText(problems) {
  const [first] = problems;
  const same = problems.every(
    ([, e]) => e instanceof ApiFailure && e.status && e.message === first[1].message && e.status === first[1].status,
  );
  if (problems.length > 1 && same) {
    const ids = problems.map(([what, e]) => `${what} ${e.requestId}`).join(", ");
    return `${first[1].message} (HTTP ${first[1].status}; request ids: ${ids})`;
  }
  return problems.map(([what, e]) => describe(e, what)).join(" · ");
}

function drawSegments(vadJson, asrJson) {
  const list = $("vad-segments");
  const plot = $("segments-svg");
  const duration = (vadJson && vadJson.duration) || (asrJson && asrJson.duration) || 0;
  const speech = vadJson ? vadJson.segments : [];
  clear(list);
  if (vadJson && speech.length === 0) {
    const li = document.createElement("li");
    li.textContent = "no speech found";
    list.appendChild(li);
  }
  for (const seg of speech) {
    const li = document.createElement("li");
    li.className = "segment";
    li.dataset.start = String(seg.start);
    li.dataset.end = String(seg.end);
    li.textContent = `speech ${seg.start.toFixed(2)} – ${seg.end.toFixed(2)} s`;
    list.appendChild(li);
  }
  clear(plot);
  if (!(duration > 0)) return;
  const left = 50;
  const width = 560 - left - 8;
  const x = (t) => left + (width * Math.min(t, duration)) / duration;
  const lanes = [
    ["speech", speech, BUSY, 4],
    ["text", (asrJson && asrJson.segments) || [], TEXT_SEGMENT, 24],
  ];
  for (const [name, segs, colour, y] of lanes) {
    svg("rect", { x: left, y, width, height: 16, fill: LANE_BG }, plot);
    svg("text", { x: left - 6, y: y + 12, "text-anchor": "end" }, plot).textContent = name;
    for (const seg of segs) {
      const rect = svg("rect", {
        x: x(seg.start),
        y,
        width: Math.max(1, x(seg.end) - x(seg.start)),
        height: 16,
        fill: colour,
      }, plot);
      svg("title", {}, rect).textContent = seg.text
        ? `${seg.start.toFixed(2)}–${seg.end.toFixed(2)} s: ${seg.text.trim()}`
        : `speech ${seg.start.toFixed(2)}–${seg.end.toFixed(2)} s`;
    }
  }
  svg("text", { x: left, y: 58 }, plot).textContent = "0 s";
  svg("text", { x: left + width, y: 58, "text-anchor": "end" }, plot).textContent = seconds(duration);
}

// ------------------------------------------------------------------ record
let recording = null;

function recordingType() {
  const types = ["audio/webm;codecs=opus", "audio/webm", "audio/ogg;codecs=opus", "audio/mp4"];
  return types.find((t) => window.MediaRecorder && MediaRecorder.isTypeSupported(t)) || "";
}

function extension(mime) {
  if (mime.startsWith("audio/ogg")) return "ogg";
  if (mime.startsWith("audio/mp4")) return "m4a";
  return "webm";
}

async function toggleRecording() {
  const button = $("record-button");
  const status = $("record-status");
  if (recording) {
    recording.recorder.stop();
    return;
  }
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || !window.MediaRecorder) {
    say(status, "the microphone needs a secure page (https, or http on localhost)", "error");
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (err) {
    say(status, `microphone: ${err.message || err.name}`, "error");
    return;
  }
  const type = recordingType();
  const recorder = new MediaRecorder(stream, type ? { mimeType: type } : {});
  const chunks = [];
  const started = performance.now();
  recording = { recorder, bytes: 0 };
  recorder.ondataavailable = (event) => {
    if (event.data.size === 0) return;
    chunks.push(event.data);
    recording.bytes += event.data.size;
    status.dataset.bytes = String(recording.bytes);
    say(status, `recording… ${seconds((performance.now() - started) / 1000)}`, "recording");
  };
  recorder.onstop = () => {
    for (const track of stream.getTracks()) track.stop();
    const mime = recorder.mimeType || type || "audio/webm";
    const blob = new Blob(chunks, { type: mime });
    recording = null;
    button.textContent = "Record";
    say(status, `recorded ${(blob.size / 1024).toFixed(0)} KiB of ${mime}`, "ok");
    transcribe(blob, `recording.${extension(mime)}`);
  };
  recorder.start(250);
  button.textContent = "Stop";
  status.dataset.bytes = "0";
  say(status, "recording…", "recording");
}

// ------------------------------------------------------------------ live view
const history = new Map(); // model id -> [{t, active, queued, state, slots}]
const cards = new Map(); // model id -> {root, head, plot}

function card(id) {
  let c = cards.get(id);
  if (c) return c;
  const root = document.createElement("div");
  root.className = "model";
  root.dataset.model = id;
  const head = document.createElement("div");
  head.className = "model-head";
  const plot = svg("svg", { role: "img", "aria-label": `${id} slots over time` });
  root.append(head, plot);
  $("models").appendChild(root);
  c = { root, head, plot };
  cards.set(id, c);
  return c;
}

// Where ``test(sample)`` held, as [start, end, sample] spans: a sample holds until the next one.
function spans(samples, now, test) {
  const out = [];
  let open = null;
  samples.forEach((s, i) => {
    const end = i + 1 < samples.length ? samples[i + 1].t : now;
    if (test(s)) {
      if (open && open[2] === test(s)) open[1] = end;
      else {
        open = [s.t, end, test(s)];
        out.push(open);
      }
    } else {
      open = null;
    }
  });
  return out;
}

function drawModel(row, samples, now, index) {
  const { root, head, plot } = card(row.id);
  const queued = row.queued_requests + row.queued_management;
  root.dataset.state = row.state;
  root.dataset.active = String(row.active_slots);
  root.dataset.queued = String(queued);

  clear(head);
  const name = document.createElement("b");
  name.textContent = row.id;
  const kind = document.createElement("span");
  kind.textContent = `${row.family} · ${row.task} · ${row.mode} · ${row.backend}`;
  const state = document.createElement("span");
  state.className = `state ${row.state}`;
  state.textContent = row.state;
  const load = document.createElement("span");
  load.className = "load";
  load.textContent = `${row.active_slots}/${row.slots} slots busy · ${row.queued_requests} queued` +
    (row.queued_management ? ` · ${row.queued_management} management waiting` : "");
  head.append(name, kind, state, load);

  const W = 1100;
  const left = 78;
  const width = W - left - 12;
  const laneH = 14;
  const gap = 4;
  const lanes = ["state", ...Array.from({ length: row.slots }, (_, i) => `slot ${i}`)];
  const queueTop = 4 + lanes.length * (laneH + gap) + 4;
  const queueH = 30;
  const H = queueTop + queueH + 18;
  const span = Number($("window").value) || 60;
  const from = now - span;
  const x = (t) => left + (width * (Math.max(t, from) - from)) / span;
  clear(plot);
  plot.setAttribute("viewBox", `0 0 ${W} ${H}`);

  lanes.forEach((label, i) => {
    const y = 4 + i * (laneH + gap);
    const g = svg("g", { class: i === 0 ? "lane state-lane" : "lane slot" }, plot);
    if (i > 0) {
      g.dataset.slot = String(i - 1);
      g.dataset.busy = String(row.active_slots > i - 1);
    }
    svg("rect", { x: left, y, width, height: laneH, fill: LANE_BG }, g);
    svg("text", { x: left - 6, y: y + 11, "text-anchor": "end" }, g).textContent = label;
    if (i === 0) {
      for (const [t0, t1, st] of spans(samples, now, (s) => (s.state in STATE_COLOURS ? s.state : null))) {
        if (t1 < from) continue;
        const thin = st === "ready";
        svg("rect", {
          x: x(t0), y: thin ? y + laneH * 0.35 : y, width: Math.max(1, x(t1) - x(t0)),
          height: thin ? laneH * 0.3 : laneH, fill: STATE_COLOURS[st], class: `span ${st}`,
        }, g);
      }
    } else {
      for (const [t0, t1] of spans(samples, now, (s) => s.active > i - 1)) {
        if (t1 < from) continue;
        svg("rect", {
          x: x(t0), y: y + 1, width: Math.max(1, x(t1) - x(t0)), height: laneH - 2,
          fill: BUSY, class: "busy",
        }, g);
      }
    }
  });

  // queue depth: requests and managers waiting, as a step line
  const visible = samples.filter((s, i) => i + 1 === samples.length || samples[i + 1].t >= from);
  const top = Math.max(1, ...visible.map((s) => s.queued));
  const yq = (n) => queueTop + queueH - (queueH * n) / top;
  svg("rect", { x: left, y: queueTop, width, height: queueH, fill: "#fff", stroke: "#eee" }, plot);
  svg("text", { x: left - 6, y: queueTop + 12, "text-anchor": "end" }, plot).textContent = "queue";
  svg("text", { x: left - 6, y: queueTop + 25, "text-anchor": "end" }, plot).textContent = `max ${top}`;
  if (visible.length) {
    let d = `M ${x(visible[0].t)} ${yq(visible[0].queued)}`;
    visible.forEach((s, i) => {
      const next = i + 1 < visible.length ? visible[i + 1] : null;
      const end = next ? next.t : now;
      d += ` H ${x(end)}`;
      if (next) d += ` V ${yq(next.queued)}`;
    });
    svg("path", {
      d, fill: "none", stroke: QUEUE_COLOURS[index % QUEUE_COLOURS.length], "stroke-width": 1.5,
      class: "queue",
    }, plot);
  }
  for (let ago = span; ago >= 0; ago -= TICKS[span] || span / 6) {
    const tx = x(now - ago);
    svg("line", { x1: tx, x2: tx, y1: queueTop + queueH, y2: queueTop + queueH + 4, stroke: "#999" }, plot);
    svg("text", { x: tx, y: H - 2, "text-anchor": ago === 0 ? "end" : "middle" }, plot).textContent =
      ago === 0 ? "now" : ago % 60 === 0 ? `−${ago / 60} min` : `−${ago} s`;
  }
}

function update(rows, now) {
  fillSelects(rows);
  fillLiveModels(rows);
  const seen = new Set();
  rows.forEach((row, index) => {
    seen.add(row.id);
    const samples = history.get(row.id) || [];
    samples.push({
      t: now,
      active: row.active_slots,
      queued: row.queued_requests + row.queued_management,
      state: row.state,
    });
    while (samples.length > 2 && samples[1].t < now - KEEP_S) samples.shift();
    history.set(row.id, samples);
    drawModel(row, samples, now, index);
  });
  for (const [id, c] of cards) {
    if (!seen.has(id)) {
      c.root.remove();
      cards.delete(id);
      history.delete(id);
    }
  }
  const live = $("live");
  live.dataset.polls = String(Number(live.dataset.polls || 0) + 1);
}

let connected = null;

async function showHealth() {
  const badge = $("health");
  try {
    const resp = await fetch("/health", { cache: "no-store" });
    const h = await resp.json();
    badge.textContent = `${h.backend} backend · ${h.runtime} runtime · ${h.models} model(s)`;
    badge.classList.remove("down");
  } catch (err) {
    badge.textContent = `server unreachable (${err.message})`;
    badge.classList.add("down");
  }
}

async function poll() {
  try {
    const resp = await fetch("/v1/models", { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const rows = (await resp.json()).data;
    update(rows, performance.now() / 1000);
    if (connected !== true) {
      connected = true;
      showHealth();
    }
  } catch (err) {
    if (connected !== false) {
      connected = false;
      $("health").textContent = `server unreachable (${err.message})`;
      $("health").classList.add("down");
    }
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

// ------------------------------------------------------------------ wiring
document.addEventListener("DOMContentLoaded", () => {
  $("speak-button").addEventListener("click", speak);
  $("tts-model").addEventListener("change", loadVoices);
  $("record-button").addEventListener("click", toggleRecording);
  $("live-button").addEventListener("click", toggleLive);
  $("audio-file").addEventListener("change", (event) => {
    const file = event.target.files[0];
    if (file) transcribe(file, file.name);
    event.target.value = ""; // the same file can be picked again
  });
  poll();
});
