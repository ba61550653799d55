#!/usr/bin/env node
// AG-UI 1.0 test client (@ag-ui/client@1.0.0 + @ag-ui/core@1.0.0).
//
// Usage:
//   node agui_client.mjs <url> [runAgentInput-json | @file] [--lenient] [--verbose]
//
// It POSTs a RunAgentInput with the library's own HttpAgent. HttpAgent builds
// the request body itself (threadId, runId, protocolVersion:"1.0", tools,
// context, forwardedProps, state, messages) from the agent's threadId /
// initialMessages / initialState and runAgent({runId, tools, context,
// forwardedProps, resume}); this script seeds those from the given JSON, so the
// body sent equals the given one (plus protocolVersion, minus role:"activity"
// messages).
//
// Pipeline that validates the response (all library code):
//   runHttpRequest -> transformHttpEventStream/parseSSEStream (SSE framing, JSON)
//   -> [strict only: EventSchemas.safeParse on every RAW wire event, so an
//       unknown event type or a legacy null is a schema failure (exit 2)]
//   -> CompatibilityBoundary -> enforceEvents (EventSchema.parse per type, strip
//   unknown keys) -> transformChunks (*_CHUNK expansion) -> verifyEvents
//   (ordering rules) -> defaultApplyEvents (messages/state reducer).
//
// By default the script is STRICT: things the library only warns about are
// failures too (unknown event type dropped, unknown property stripped, deprecated
// shape converted, reducer warnings such as a failed JSON patch, a stream that
// ends without RUN_FINISHED/RUN_ERROR). --lenient restores library behaviour.
//
// stdout (success only): JSON {threadId, runId, outcome, result, state, messages,
//                              newMessages, eventCount, custom}
// exit 0 ok | 1 usage/HTTP | 2 schema validation | 3 verifier/ordering |
//      4 RUN_ERROR received | 5 other stream error | 6 strict-mode warning |
//      7 strict: stream ended without RUN_FINISHED / RUN_ERROR

import fs from 'node:fs';
import { HttpAgent, AGUIError } from '@ag-ui/client';
import { EventSchemas, RunAgentInputSchema } from '@ag-ui/core/schemas';
import { Observable } from 'rxjs';

const args = process.argv.slice(2);
const lenient = args.includes('--lenient');
const verbose = args.includes('--verbose');
const positional = args.filter(a => !a.startsWith('--'));
const [url, bodyArg] = positional;
if (!url) {
  console.error('usage: node agui_client.mjs <url> [runAgentInput-json | @file] [--lenient] [--verbose]');
  process.exit(1);
}

let input;
if (bodyArg == null) {
  input = {
    threadId: 'thread-1',
    runId: 'run-1',
    state: {},
    messages: [{ id: 'user-1', role: 'user', content: 'Hello' }],
    tools: [
      {
        name: 'get_weather',
        description: 'Get the weather for a city',
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
      },
    ],
    context: [],
    forwardedProps: {},
  };
} else {
  input = JSON.parse(bodyArg.startsWith('@') ? fs.readFileSync(bodyArg.slice(1), 'utf8') : bodyArg);
}
// Validate the request with the library's own schema first.
const parsedInput = RunAgentInputSchema.safeParse(input);
if (!parsedInput.success) {
  console.error('FAILED (usage): the given RunAgentInput is invalid:', parsedInput.error.message);
  process.exit(1);
}

// ---- capture library warnings (strict mode turns them into failures) ----
const warnings = [];
const origWarn = console.warn;
console.warn = (...a) => {
  warnings.push(a.map(String).join(' '));
  origWarn('[warn]', ...a);
};
// AbstractAgent.onError logs "Agent execution failed:" before rethrowing; keep it quiet
const origError = console.error;
console.error = (...a) => {
  if (typeof a[0] === 'string' && a[0].startsWith('Agent execution failed')) {
    if (verbose) origError(...a);
    return;
  }
  origError(...a);
};

class RawSchemaError extends Error {
  constructor(event, zodError) {
    super(`event #${event.__index} (${event?.type}) fails EventSchemas: ${zodError.message}`);
    this.name = 'RawSchemaError';
  }
}

let eventCount = 0;
let sawTerminal = null; // 'RUN_FINISHED' | 'RUN_ERROR'
class ValidatingHttpAgent extends HttpAgent {
  run(runInput) {
    const wire$ = super.run(runInput); // runHttpRequest + transformHttpEventStream
    return new Observable(sub =>
      wire$.subscribe({
        next: ev => {
          eventCount++;
          if (verbose) origError('event', JSON.stringify(ev));
          // strict: validate the RAW wire event (before the library's compat shims
          // turn legacy nulls into absences / drop unknown event types)
          const r = lenient ? { success: true } : EventSchemas.safeParse(ev);
          if (!r.success) {
            Object.defineProperty(ev, '__index', { value: eventCount, enumerable: false });
            sub.error(new RawSchemaError(ev, r.error));
            return;
          }
          if (ev.type === 'RUN_FINISHED' || ev.type === 'RUN_ERROR') sawTerminal = ev.type;
          sub.next(ev);
        },
        error: e => sub.error(e),
        complete: () => sub.complete(),
      }),
    );
  }
}

const agent = new ValidatingHttpAgent({
  url,
  threadId: input.threadId,
  initialMessages: input.messages ?? [],
  initialState: input.state ?? {},
});

let runError = null;
let outcome = null;
let finishedResult;
const custom = []; // CUSTOM events ({name, value}) as the library delivered them
const subscriber = {
  onRunErrorEvent: ({ event }) => {
    runError = event;
  },
  onCustomEvent: ({ event }) => {
    custom.push({ name: event.name, value: event.value });
  },
  onRunFinishedEvent: params => {
    outcome = params.event.outcome ?? { type: params.outcome };
    finishedResult = params.result;
  },
};

function classify(err) {
  if (err?.name === 'RawSchemaError' || err?.name === 'ZodError' || err?.constructor?.name === 'ZodError')
    return 2;
  if (err instanceof SyntaxError) return 2; // non-JSON data line
  if (/^Invalid event:/.test(err?.message ?? '')) return 2; // frame not an object / no type
  if (err instanceof AGUIError || err?.constructor?.name === 'AGUIError') return 3;
  if (/^(First |Cannot continue )/.test(err?.message ?? '')) return 3; // chunk expansion rules
  if (/^HTTP \d+/.test(err?.message ?? '') || err?.status) return 1;
  return 5;
}

try {
  const { result, newMessages } = await agent.runAgent(
    {
      runId: input.runId,
      tools: input.tools,
      context: input.context,
      forwardedProps: input.forwardedProps,
      ...(input.resume !== undefined ? { resume: input.resume } : {}),
    },
    subscriber,
  );

  const summary = {
    threadId: agent.threadId,
    runId: input.runId,
    outcome,
    result: result ?? finishedResult,
    state: agent.state,
    messages: agent.messages,
    newMessages,
    eventCount,
    custom,
  };

  if (runError) {
    console.error(`FAILED (RUN_ERROR): ${runError.message}${runError.code ? ` [code ${runError.code}]` : ''}`);
    console.error('partial: ' + JSON.stringify(summary));
    process.exit(4);
  }
  if (!lenient && warnings.length > 0) {
    console.error(`FAILED (strict): ${warnings.length} library warning(s); first: ${warnings[0]}`);
    console.error('partial: ' + JSON.stringify(summary));
    process.exit(6);
  }
  if (!lenient && sawTerminal == null) {
    console.error('FAILED (strict): stream ended without RUN_FINISHED or RUN_ERROR');
    console.error('partial: ' + JSON.stringify(summary));
    process.exit(7);
  }
  console.error(`ok: ${eventCount} valid events, ${agent.messages.length} message(s)`);
  process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
  process.exit(0);
} catch (err) {
  const code = classify(err);
  const kind = { 1: 'http', 2: 'schema validation', 3: 'verification/ordering', 5: 'stream' }[code];
  const msg = String(err?.message ?? err);
  console.error(`FAILED (${kind}): ${err?.name}: ${verbose ? msg : msg.slice(0, 600)}`);
  console.error('partial: ' + JSON.stringify({ messages: agent.messages, state: agent.state, eventCount }));
  process.exit(code);
}
