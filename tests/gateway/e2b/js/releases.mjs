// Drives one release of E2B's JS SDK (`e2b`, unmodified, under an npm alias such as e2b-2-45)
// with its defaults against replgate. Run by test_sdk_releases.py as `node releases.mjs <package>`
// with E2B's three environment variables set (or, before 2.7, E2B_DOMAIN naming the domain whose
// host names the gateway answers); prints one JSON object of what each step saw, or exits
// non-zero with the error.
import { readFileSync } from 'node:fs'

const name = process.argv[2]
const { Sandbox } = await import(name)
const manifest = new URL(`./node_modules/${name}/package.json`, import.meta.url)
const seen = { version: JSON.parse(readFileSync(manifest, 'utf8')).version }

const sbx = await Sandbox.create() // the SDK's defaults: template "base", its timeout and flags
seen.command = (await sbx.commands.run('echo ok')).stdout
await sbx.files.write('/home/user/a.txt', 'written')
seen.file = await sbx.files.read('/home/user/a.txt')
seen.running = await sbx.isRunning()
const listed = await Sandbox.list().nextItems()
seen.listed = listed.some((s) => s.sandboxId === sbx.sandboxId)
await sbx.kill()
seen.runningAfterKill = await sbx.isRunning()
console.log(JSON.stringify(seen))
