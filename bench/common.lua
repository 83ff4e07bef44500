-- Shared by the bench's wrk scripts (each loads it with dofile): thread ids, and the one line
-- of JSON (WRK_RESULT) that bench/run.py reads, with the counters the scripts keep per thread:
-- replayed (answers with Idempotent-Replayed: true) and pairs (completed authorize + capture).
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_id", #threads)
end

replayed, pairs_done, used_upto = 0, 0, -1

-- Reads this thread's interleaved share of a file of ids (one per line) from line ID_OFFSET on
-- (0-based), with each id's line number: the harness starts the next run after the highest line
-- any thread used (used_upto), so that no run meets an id an earlier run used.
function read_ids(path)
  local ids, lines = {}, {}
  local index, threads = 0, tonumber(os.getenv("WRK_THREADS") or "2")
  local offset = tonumber(os.getenv("ID_OFFSET") or "0")
  for line in io.lines(path) do
    if index >= offset and (index - offset) % threads == (thread_id - 1) then
      ids[#ids + 1] = line
      lines[#ids] = index
    end
    index = index + 1
  end
  return ids, lines
end

-- Counts a replayed answer (a script whose every request should run anew calls this).
function count_replay(headers)
  if headers["Idempotent-Replayed"] or headers["idempotent-replayed"] then
    replayed = replayed + 1
  end
end

function done(summary, latency, requests)
  local function total(name)
    local sum = 0
    for _, thread in ipairs(threads) do
      sum = sum + (thread:get(name) or 0)
    end
    return sum
  end
  local used = -1
  for _, thread in ipairs(threads) do
    used = math.max(used, thread:get("used_upto") or -1)
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,'
      .. '"errors":%d,"connect_errors":%d,"status_errors":%d,"timeouts":%d,"replayed":%d,"pairs":%d,"used_upto":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, e.connect + e.read + e.write + e.status + e.timeout,
    e.connect, e.status, e.timeout, total("replayed"), total("pairs_done"), used))
end
