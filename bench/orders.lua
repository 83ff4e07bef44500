-- wrk script: POST /orders, a fresh Idempotency-Key per request. With DUP_RATE (0 to 1), that
-- fraction of requests repeats one of the thread's 64 most recent keys instead (same body), so
-- duplicates arrive both after and during the original. With REPLAY_KEYS=N, every request
-- replays one of the keys replay-1 .. replay-N (created beforehand by the harness).
dofile(os.getenv("BENCH_LUA_DIR") .. "/common.lua")

local body = '{"currency":"USD","items":[{"sku":"tee-black-m","quantity":2,"unit_price":"19.99"},'
  .. '{"sku":"mug","quantity":1,"unit_price":"8.50"}]}'
local auth = "Bearer " .. os.getenv("ORDERPAY_KEY")
local dup_rate = tonumber(os.getenv("DUP_RATE") or "0")
local replay_keys = tonumber(os.getenv("REPLAY_KEYS") or "0")
local prefix, counter, recent = nil, 0, {}

function init(args)
  math.randomseed(os.time() * 1000 + (thread_id or 0))
  prefix = string.format("bench-%d-%d-%d", os.time(), thread_id or 0, math.random(1, 1000000000))
end

local headers = { ["Authorization"] = auth, ["Content-Type"] = "application/json" }

function request()
  local key
  if replay_keys > 0 then
    key = "replay-" .. math.random(1, replay_keys)
  elseif dup_rate > 0 and #recent > 0 and math.random() < dup_rate then
    key = recent[math.random(1, #recent)]
  else
    counter = counter + 1
    key = prefix .. "-" .. counter
    recent[(counter - 1) % 64 + 1] = key
  end
  headers["Idempotency-Key"] = key
  return wrk.format("POST", "/orders", headers, body)
end
