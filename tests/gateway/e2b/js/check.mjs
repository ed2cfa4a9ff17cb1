// Drives E2B's JS SDK (@e2b/code-interpreter, unmodified) against replgate. Run by
// test_js_sdk.py with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set; exits non-zero on the
// first failed check, naming it.
import assert from 'node:assert/strict'
import { CommandExitError, Sandbox, TimeoutError } from '@e2b/code-interpreter'

const checks = []
const check = (name, fn) => checks.push([name, fn])
let sbx

check('create', async () => {
  sbx = await Sandbox.create()
  assert.ok(sbx.sandboxId)
})

check('list shows the sandbox', async () => {
  const page = await Sandbox.list().nextItems()
  assert.ok(page.some((s) => s.sandboxId === sbx.sandboxId))
})

check('runCode keeps state', async () => {
  await sbx.runCode('x = 41')
  const exec = await sbx.runCode('x + 1')
  assert.equal(exec.text, '42')
})

check('runCode streams stdout and stderr to callbacks', async () => {
  const out = []
  const err = []
  await sbx.runCode("import sys\nprint('hello')\nprint('oops', file=sys.stderr)", {
    onStdout: (m) => out.push(m.line),
    onStderr: (m) => err.push(m.line),
  })
  assert.equal(out.join(''), 'hello\n')
  assert.equal(err.join(''), 'oops\n')
})

check('runCode reports errors as data', async () => {
  const exec = await sbx.runCode('1 / 0')
  assert.equal(exec.error.name, 'ZeroDivisionError')
})

check('runCode returns a PNG chart with its data', async () => {
  const exec = await sbx.runCode(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('t')\nplt.show()")
  const figure = exec.results.find((r) => r.png && r.png.length > 1000)
  assert.ok(figure)
  assert.equal(figure.chart.type, 'line')
  assert.equal(figure.chart.title, 't')
  assert.deepEqual(figure.chart.elements[0].points.map((p) => p.map(Number)), [[1, 3], [2, 1], [3, 2]])
})

check("runCode returns a DataFrame's html", async () => {
  const exec = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
  assert.ok(exec.results[0].html.includes('<table'))
})

check('runCode timeout stops the cell and keeps state', async () => {
  await sbx.runCode("kept = 'yes'")
  await assert.rejects(sbx.runCode('import time\nwhile True: time.sleep(0.1)', { timeoutMs: 2000 }))
  const exec = await sbx.runCode('kept', { timeoutMs: 20000 })
  assert.equal(exec.text, 'yes')
})

check('files write, read, list, remove', async () => {
  await sbx.files.write('/home/user/js.txt', 'from js')
  assert.equal(await sbx.files.read('js.txt'), 'from js')
  const names = (await sbx.files.list('/home/user')).map((e) => e.name)
  assert.ok(names.includes('js.txt'))
  const exec = await sbx.runCode("open('js.txt').read()")
  assert.equal(exec.text, 'from js')
  await sbx.files.remove('js.txt')
  assert.equal(await sbx.files.exists('js.txt'), false)
})

check('commands.run: output, exit codes, envs, cwd, streaming', async () => {
  const ok = await sbx.commands.run('echo out; echo err >&2')
  assert.deepEqual([ok.exitCode, ok.stdout, ok.stderr], [0, 'out\n', 'err\n'])
  await assert.rejects(sbx.commands.run('exit 4'),
    (e) => e instanceof CommandExitError && e.exitCode === 4)
  const out = []
  const res = await sbx.commands.run('echo "$NAME"; pwd', {
    envs: { NAME: 'js' }, cwd: '/home/user', onStdout: (d) => out.push(d),
  })
  assert.equal(out.join(''), res.stdout)
  assert.equal(res.stdout.split('\n')[0], 'js')
})

check('commands.run timeout, background wait and kill', async () => {
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1000 }),
    (e) => e instanceof TimeoutError)
  const quick = await sbx.commands.run('sleep 0.3; echo done', { background: true })
  assert.equal((await quick.wait()).stdout, 'done\n')
  const slow = await sbx.commands.run('sleep 60', { background: true })
  assert.ok(await slow.kill())
  await assert.rejects(slow.wait(), (e) => e instanceof CommandExitError)
})

check('commands with stdin, and a terminal: input, resize, exit', async () => {
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'from js stdin')
  await sbx.commands.closeStdin(cat.pid)
  assert.equal((await cat.wait()).stdout, 'from js stdin')
  const chunks = []
  const term = await sbx.pty.create({
    cols: 80, rows: 24, cwd: '/', envs: { MARK: 'js-pty' }, onData: (d) => chunks.push(d),
  })
  await sbx.pty.resize(term.pid, { cols: 101, rows: 24 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo $MARK $PWD $(tput cols)\nexit\n'))
  assert.equal((await term.wait()).exitCode, 0)
  assert.ok(Buffer.concat(chunks).toString().includes('js-pty / 101'))
})

check('connect reaches the same state', async () => {
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.runCode('x')).text, '41')
})

check('betaPause, listed as paused, connect resumes with state', async () => {
  assert.equal(await sbx.betaPause(), true)
  assert.equal(await Sandbox.pause(sbx.sandboxId), false)
  assert.equal(await sbx.isRunning(), false)
  const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
  assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId && s.state === 'paused'))
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await again.isRunning(), true)
  assert.equal((await again.runCode('x')).text, '41')
})

check('setTimeout, then kill', async () => {
  await sbx.setTimeout(60_000)
  await sbx.kill()
  assert.equal(await sbx.isRunning(), false)
})

for (const [name, fn] of checks) {
  try {
    await fn()
    console.log(`ok ${name}`)
  } catch (error) {
    console.log(`FAILED ${name}: ${error?.stack ?? error}`)
    if (sbx) await sbx.kill().catch(() => {})
    process.exit(1)
  }
}
