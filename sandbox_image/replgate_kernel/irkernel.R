# The R kernel: IRkernel (Debian's r-cran-irkernel 1.3.2, pinned by the polyglot image's lock),
# made and run as IRkernel::main() does, with work that every execution repeated done once.
# An execution of `1+1` cost about 11 ms of R; the changes below take it to under 4
# (docs/languages.md). Each is checked against the IRkernel, evaluate, jsonlite, digest or
# uuid it was written for as the kernel starts (stopifnot), so another version fails at its
# first start, not quietly.

# Done by the first execution only, though each execution did it again: the shadowing of
# readline(), quit(), q() and getPass::getPass() by the kernel's own (bindings unlocked,
# assigned, locked again), and the evaluation of stop() that finds how deep a cell's frames
# sit, to cut tracebacks there (1.7 ms: a whole evaluate()). That depth, nframe, never changes;
# it is the guard: unset until the first probe.
once <- function(executor) {
    execute <- executor$execute
    steps <- as.list(body(execute))
    step_of <- function(pattern) {
        which(vapply(steps, function(step) any(grepl(pattern, deparse(step), fixed = TRUE)), NA))
    }
    guarded <- c(step_of("replace_in_package("), step_of("add_to_user_searchpath("),
                 step_of('"stop()"'))
    stopifnot(length(guarded) == 5L)
    for (i in guarded) steps[[i]] <- call("if", quote(length(nframe) == 0L), steps[[i]])
    body(execute) <- as.call(steps)
    execute
}

# evaluate 0.20 splits each cell into its expressions and the lines between them
# (parse_all.character) by building a data frame per group and binding them: 0.46 ms of R for
# `1+1`, 1.6 ms for a cell of seven lines. The same table made from vectors, once, takes 0.07
# and 0.14 ms. What it cannot do the same way (a cell that does not parse, or holds no
# expression) goes to evaluate's own. Checked against it as the kernel starts.
parse_cells <- function(original) {
    append_break <- evaluate:::append_break
    fast <- function(x, filename = NULL, allow_error = FALSE) {
        lines <- x
        if (length(grep("\n", lines))) {
            lines <- gsub("\n$", "\n\n", lines)
            lines[lines == ""] <- "\n"
            lines <- unlist(strsplit(lines, "\n"), recursive = FALSE, use.names = FALSE)
        }
        exprs <- tryCatch(parse(text = lines, srcfile = srcfilecopy(
            if (is.null(filename)) "<text>" else filename, lines)), error = identity)
        count <- length(exprs)
        if (inherits(exprs, "error") || count == 0L) return(original(x, filename, allow_error))
        srcref <- attr(exprs, "srcref", exact = TRUE)
        first <- vapply(srcref, `[[`, 0L, 7L)
        last <- vapply(srcref, `[[`, 0L, 8L)
        # expressions that share a line make one row, as in evaluate's
        starts <- which(c(TRUE, first[-1L] != last[-count]))
        ends <- c(starts[-1L] - 1L, count)
        src <- mapply(function(a, b) paste(lines[first[a]:last[b]], collapse = "\n"),
                      starts, ends, USE.NAMES = FALSE)
        code <- mapply(function(a, b) exprs[a:b], starts, ends, SIMPLIFY = FALSE,
                       USE.NAMES = FALSE)
        at <- first[starts]
        gaps <- cbind(c(1L, last + 1L), c(first - 1L, length(lines)))
        gaps <- gaps[gaps[, 1L] <= gaps[, 2L], , drop = FALSE]
        between <- unlist(lapply(seq_len(nrow(gaps)), function(i) gaps[i, 1L]:gaps[i, 2L]))
        if (length(between)) {
            src <- c(src, lines[between])
            code <- c(code, rep(list(NULL), length(between)))
            at <- c(at, between - 1L)  # evaluate's own keys: a line after the row it follows
        }
        rows <- order(at)
        src <- append_break(src[rows])
        code <- code[rows]
        if (src[length(src)] == "") {
            src <- src[-length(src)]
            code <- code[-length(code)]
        }
        structure(list(src = src, expr = I(code)), class = "data.frame",
                  row.names = .set_row_names(length(src)))
    }
    # srcrefs point to a srcfile environment of each call's own: compared by what they hold
    seen <- function(table) {
        refs <- function(e) lapply(attr(e, "srcref"), function(ref)
            list(as.integer(ref), get("lines", attr(ref, "srcfile"))))
        list(attributes(table)[c("names", "class")], .row_names_info(table), table$src,
             class(table$expr), lapply(table$expr, function(e) list(deparse(e), refs(e))))
    }
    for (cell in c("1+1", "a <- 1; b <- 2\n# c\n\nf <- function() {\n 1\n}\nf()\n\n", "x <- 'a\nb'"))
        stopifnot(identical(seen(fast(cell, NULL, TRUE)), seen(original(cell, NULL, TRUE))))
    fast
}

# digest::hmac pads the key and xors it again for every message (six an execution), and
# digest::digest spends 6 of its 8.5 us matching its arguments: its C function is called
# directly (SHA-256, the whole object, raw bytes or hex). Checked against the kernel's own
# signature as the kernel starts.
signer <- function(key) {
    sha256 <- function(bytes, raw) .Call(digest:::digest_impl, bytes, 4L, -1L, 0L, raw, 0L)
    key <- charToRaw(key)
    if (length(key) > 64L) key <- sha256(key, 1L)
    key <- c(key, raw(64L - length(key)))
    inner <- xor(key, as.raw(0x36))
    outer <- xor(key, as.raw(0x5c))
    function(msg_lst) sha256(c(outer, sha256(c(inner, unlist(msg_lst)), 1L)), 0L)
}

# A reply's header, as IRkernel's new_reply makes it, for a third of its cost: the UUID from
# uuid's C function, the date formatted from a prefix made once a day (strftime of a POSIXlt,
# 12 us, five times an execution), truncated to microseconds as %OS6 is.
replier <- function(protocol_version, extra) {
    uuid <- function() .Call(uuid:::UUID_gen, NA, 1L, 0L)
    day <- -1
    prefix <- ""
    stamp <- function(t) {
        d <- t %/% 86400
        if (d != day) {
            day <<- d
            prefix <<- format(.POSIXct(d * 86400, tz = "UTC"), "%Y-%m-%dT")
        }
        us <- floor((t - d * 86400) * 1e6)
        sprintf("%s%02d:%02d:%02d.%06dZ", prefix, us %/% 3.6e9, us %/% 6e7 %% 60,
                us %/% 1e6 %% 60, us %% 1e6)
    }
    for (t in c(1795000000.123456, 1795046399.5, 1795046400, 1e9 + 0.000999))
        stopifnot(identical(stamp(t), strftime(as.POSIXlt(.POSIXct(t, "UTC"), "UTC"),
                                               "%Y-%m-%dT%H:%M:%OS6Z")))
    stopifnot(grepl("^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", uuid()))
    no_metadata <- setNames(list(), character(0))
    function(msg_type, parent_msg) {
        header <- list(msg_id = uuid(), session = parent_msg$header$session,
                       username = parent_msg$header$username,
                       date = stamp(unclass(Sys.time())), msg_type = msg_type,
                       version = protocol_version)
        metadata <- no_metadata
        if (!is.null(extra$metadata)) {  # JSON text, for the next message only
            metadata <- extra$metadata
            extra$metadata <- NULL
        }
        list(header = header, parent_header = parent_msg$header,
             identities = parent_msg$identities, metadata = metadata)
    }
}

# evaluate looks for a new plot after each expression and each value by grDevices'
# recordPlot(), which stamps the R version on the snapshot: getRversion() parses it anew each
# time (26 us, three times an execution). evaluate's recordPlot stamps the same version,
# parsed once.
stamped_once <- function(record) {
    steps <- as.list(body(record))
    stamp <- which(vapply(steps, function(step) identical(step, quote(
        attr(res, "Rversion") <- getRversion())), NA))
    stopifnot(length(stamp) == 1L)
    steps[[stamp]][[3L]] <- getRversion()
    body(record) <- as.call(steps)
    record
}

# jsonlite's toJSON(x, auto_unbox = TRUE), ten times faster for what messages hold: lists,
# named or not, of strings, integers and logicals (0.01 ms for an execute_reply's content
# against 0.14: toJSON dispatches an S4 method per value). It uses jsonlite's own escaping and
# joining, so the text is the same; anything else (numbers, NA, attributes, classes) goes to
# toJSON itself. Checked against toJSON as the kernel starts.
encoder <- function() {
    escape <- jsonlite:::deparse_vector
    join_array <- jsonlite:::collapse
    join_object <- jsonlite:::collapse_object
    fallback <- function(x) as.character(jsonlite::toJSON(x, auto_unbox = TRUE))
    encode <- function(x) {
        if (is.null(x)) return("{}")
        kept <- names(attributes(x))
        if (is.list(x)) {
            if (is.null(kept))
                return(join_array(vapply(x, encode, "", USE.NAMES = FALSE), indent = NA))
            keys <- names(x)
            if (!identical(kept, "names") || anyNA(keys) || !all(nzchar(keys))) return(fallback(x))
            return(join_object(escape(enc2utf8(keys)), vapply(x, encode, "", USE.NAMES = FALSE),
                               indent = NA))
        }
        if (!is.null(kept) || anyNA(x)) return(fallback(x))
        text <- switch(typeof(x),
                       character = escape(enc2utf8(x)),
                       integer = as.character(x),
                       logical = ifelse(x, "true", "false"))
        if (is.null(text)) fallback(x)
        else if (length(x) == 1L) text
        else join_array(text, indent = NA)
    }
    probes <- list(
        list(status = "ok", execution_count = 3L, payload = list(),
             user_expressions = setNames(list(), character(0))),
        list(data = list(`text/plain` = "[1] 2", `text/html` = "2"), metadata = NULL),
        list(name = "stdout", text = "h\u00e9llo \"q\" \\ /\n\t\u0001 \u2713"),
        list(ename = "e", traceback = c("a", "b"), none = character(0), flags = c(TRUE, FALSE)),
        list(width = 504, height = 3.5, missing = NA, f = factor("x"), nested = list(list(1L))))
    for (probe in probes)
        stopifnot(identical(encode(probe),
                            as.character(jsonlite::toJSON(probe, auto_unbox = TRUE))))
    encode
}

# A message was four encodings by jsonlite's toJSON (0.13 ms each; 0.65 ms a message, five
# messages an execution) of which only the content changes: the parent header and the session
# fields repeat for every message of a request, the metadata is empty, a status's content is
# one of three.
wire <- function(sign_msg) {
    json <- encoder()
    empty <- charToRaw("{}")
    statuses <- lapply(c(busy = "busy", idle = "idle", starting = "starting"),
                       function(state) charToRaw(json(list(execution_state = state))))
    parent <- NULL
    parent_json <- charToRaw(json(NULL))
    who <- NULL
    who_json <- NULL
    function(msg) {
        header <- msg$header
        if (!identical(msg$parent_header, parent)) {
            parent <<- msg$parent_header
            parent_json <<- charToRaw(json(parent))
        }
        fields <- header[c("session", "username")]
        if (!identical(fields, who)) {
            who <<- fields
            who_json <<- substring(json(fields), 2L)  # its members and its closing brace
        }
        state <- if (identical(header$msg_type, "status")) msg$content$execution_state
        content <- if (is.character(state) && length(state) == 1L && state %in% names(statuses))
            statuses[[state]] else charToRaw(json(msg$content))
        bodyparts <- list(
            # msg_id (a UUID), date, msg_type and version: plain ASCII, nothing to escape
            charToRaw(sprintf('{"msg_id":"%s","date":"%s","msg_type":"%s","version":"%s",%s',
                              header$msg_id, header$date, header$msg_type, header$version,
                              who_json)),
            parent_json,
            if (is.character(msg$metadata)) charToRaw(msg$metadata)
            else if (length(msg$metadata) == 0L) empty else charToRaw(json(msg$metadata)),
            content)
        c(msg$identities, list(charToRaw("<IDS|MSG>"), charToRaw(sign_msg(bodyparts))),
          bodyparts)
    }
}

# IRkernel sends every visible value as a display_data; a cell's result (execute_result, with
# its execution count, as ipykernel sends the value of a cell's last expression) is then the
# value nothing came after. So a value is held: the execution's next message, or next value,
# sends it first as the display it was, its reply (when the cell ran to its end) as its result.
# handle_value's own send of the display is swapped for the hold.
results <- function(executor, send) {
    force(send)
    held <- NULL
    shown <- function() {
        if (is.null(held)) return(NULL)
        bundle <- held
        held <<- NULL
        bundle
    }
    hold <- function(request, bundle) {
        if (!is.null(earlier <- shown())) send("display_data", request, "iopub", earlier)
        held <<- bundle
    }
    from <- quote(send_response("display_data", current_request, "iopub", mimebundle))
    swaps <- 0L
    swap <- function(e) {
        if (identical(e, from)) {
            swaps <<- swaps + 1L
            return(as.call(list(hold, quote(current_request), quote(mimebundle))))
        }
        if (is.call(e)) for (i in seq_along(e)) e[[i]] <- swap(e[[i]])
        e
    }
    handle_value <- executor$handle_value
    body(handle_value) <- swap(body(handle_value))
    stopifnot(swaps == 1L)
    list(handle_value = handle_value, send = function(msg_type, parent_msg, socket_name,
                                                        content) {
        if (!is.null(bundle <- shown())) {
            if (identical(msg_type, "execute_reply") && identical(content$status, "ok"))
                send("execute_result", parent_msg, "iopub",
                     c(list(execution_count = content$execution_count), bundle))
            else send("display_data", parent_msg, "iopub", bundle)
        }
        send(msg_type, parent_msg, socket_name, content)
    })
}

# The files an execution created, modified or deleted in the workspace, in its reply's
# metadata as the Python kernel reports them (replgate_kernel/files.py). R cannot follow the
# workspace itself: files.py does, as this process's child, told on a FIFO when an execution
# starts (it answers once it has forgotten what changed before) and asked when it ends (it
# answers the changes, one JSON line), on its stdout. One that died (the clean-up after an
# interrupted execution kills the kernel's children) is started again at the next execution.
files_watcher <- function(root) {
    path <- file.path(tempdir(), "replgate-files")
    command <- sprintf("exec /opt/venv/bin/python -I -S /opt/replgate/replgate_kernel/files.py %s %s",
                       shQuote(root), shQuote(path))
    requests <- NULL
    answers <- NULL
    stop_watcher <- function() {
        for (connection in list(requests, answers))
            if (!is.null(connection)) try(close(connection), silent = TRUE)
        requests <<- NULL
        answers <<- NULL
    }
    start_watcher <- function() {
        answers <<- pipe(command, open = "r")
        # the FIFO is there once it says so; opened before, the open could wait forever
        if (!identical(readLines(answers, n = 1L), "ready")) stop("the watcher did not start")
        requests <<- fifo(path, open = "w", blocking = TRUE)
    }
    ask <- function(what) {
        said <- tryCatch(withCallingHandlers({
            if (is.null(requests)) start_watcher()
            writeLines(what, requests)
            flush(requests)
            readLines(answers, n = 1L)
        }, warning = function(w) invokeRestart("muffleWarning")), error = function(e) NULL)
        if (length(said) != 1L) {
            stop_watcher()
            return(NULL)
        }
        said
    }
    list(start = function() if (is.null(ask("start"))) ask("start"),  # again, with a new one
         finish = function() {
             said <- ask("finish")
             if (is.null(said)) '{"files":[],"truncated":true}' else said
         })
}

# Wraps what the executor sends: the files are followed from its execute_input (the first
# message of an execution) to its reply, which carries them.
follow_files <- function(send, watcher, extra) {
    force(send)
    function(msg_type, parent_msg, socket_name, content) {
        if (identical(msg_type, "execute_input")) watcher$start()
        else if (identical(msg_type, "execute_reply"))
            extra$metadata <- paste0('{"replgate_files":', watcher$finish(), "}")
        send(msg_type, parent_msg, socket_name, content)
    }
}

local({
    kernel <- IRkernel:::Kernel$new(connection_file = commandArgs(TRUE)[[1]])
    sign_msg <- signer(kernel$connection_info$key)
    stopifnot(identical(sign_msg(list(charToRaw("replgate"))),
                        kernel$sign_msg(list(charToRaw("replgate")))))
    assign("execute", once(kernel$executor), envir = as.environment(kernel$executor))
    assign("sign_msg", sign_msg, envir = as.environment(kernel))
    assign("msg_to_wire", wire(sign_msg), envir = as.environment(kernel))
    extra <- new.env()
    assign("new_reply", replier(IRkernel:::PROTOCOL_VER, extra), envir = as.environment(kernel))
    executor <- kernel$executor
    valued <- results(executor, follow_files(executor$send_response, files_watcher(getwd()),
                                             extra))
    assign("handle_value", valued$handle_value, envir = as.environment(executor))
    executor$send_response <- valued$send
    rebind <- function(name, value, envir) {
        unlockBinding(name, envir)
        assign(name, value, envir = envir)
        lockBinding(name, envir)
    }
    evaluate <- asNamespace("evaluate")
    parse_all <- parse_cells(evaluate$parse_all.character)
    rebind("parse_all.character", parse_all, evaluate)
    registerS3method("parse_all", "character", parse_all, envir = evaluate)
    rebind("recordPlot", stamped_once(grDevices::recordPlot), parent.env(evaluate))  # its imports
    # IRkernel tries every value in each of its display mimetypes, a repr S3 dispatch each. Six
    # of them only objects of packages not in this image have a method for (htmlwidgets, sf,
    # plotly, vegalite and the like; 0.25 ms of each value's 0.6): not tried. A session that
    # defines such a method can set the option back.
    unmade <- c("application/javascript", "application/geo+json", "application/vdom.v1+json",
                "application/vnd.plotly.v1+json", "application/vnd.vegalite.v2+json",
                "application/vnd.vega.v4+json")
    options(jupyter.display_mimetypes = setdiff(getOption("jupyter.display_mimetypes"), unmade))
    kernel$run()
})
