"""Generate the support-email dataset that ``scenarios/support_email.yaml`` feeds the agents.

    python scenarios/data/make_support_emails.py --seed 7 --count 600 \\
        -o scenarios/data/support_emails.jsonl

Deterministic: the same seed and count give the same bytes (one ``random.Random``, no clock, no
hash-ordered iteration), so the committed file can be checked against its seed in a test.

Each line is one email as a JSON object with its ground truth under ``expected``:

* ``intent``: question | complaint | refund | bug | spam | outage (``null`` for malformed rows);
* ``action``: what a correct team does. question -> reply, complaint -> ticket, refund -> reply
  when the amount is at most 200 and escalate (human approval) above it, bug -> ticket,
  spam -> ignore, outage -> escalate; malformed rows -> reject;
* ``amount``: the refund asked for, in the currency written (no conversion), else ``null``;
* ``pii``: whether the body carries personal data (an e-mail address, a phone number, a card
  number or an IBAN) that a reply must not echo.

The phrasing is varied on purpose: many templates, greetings, fillers and sign-offs per intent,
and traps that make keyword rules good but not perfect (a complaint that says it does not want
a refund, spam offering a "tax refund", a question about the refund policy, angry follow-ups
quoting the original request). About one line in seventy is malformed, including two that are
not JSON objects at all.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REFUND_LIMIT = 200.0
SUPPORT = "support@acme.example"
START = datetime(2024, 3, 4, 7, 0, tzinfo=UTC)
SPAN_DAYS = 28

# Share of each kind of email among the well-formed ones. "followup" is an angry complaint in
# an existing thread; it needs an earlier email to follow, so the first few are never one.
WEIGHTS = {
    "question": 22,
    "complaint": 14,
    "followup": 7,
    "refund": 20,
    "bug": 15,
    "spam": 13,
    "outage": 6,
}
# Probability that an email of each intent carries PII (about 15% overall).
PII_RATE = {
    "question": 0.13,
    "complaint": 0.15,
    "followup": 0.12,
    "refund": 0.30,
    "bug": 0.13,
    "spam": 0.03,
    "outage": 0.12,
}
MALFORMED = (
    "missing_from",
    "body_not_string",
    "empty",
    "garbage",
    "not_an_object",
    "bad_from",
    "truncated_json",
    "body_null",
    "bad_date",
)

FIRST = [
    "Anna",
    "Ben",
    "Carla",
    "Dmitri",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Keiko",
    "Liam",
    "Maria",
    "Nils",
    "Olga",
    "Pedro",
    "Quinn",
    "Rosa",
    "Samir",
    "Tess",
    "Umar",
    "Vera",
    "Wei",
    "Ximena",
    "Yusuf",
    "Zoe",
    "Aiko",
    "Bruno",
    "Chloe",
    "Diego",
    "Emma",
    "Felix",
    "Gita",
    "Hugo",
    "Irene",
    "Jakub",
    "Kofi",
    "Lena",
    "Marco",
    "Nadia",
    "Oscar",
    "Priya",
    "Rafael",
    "Sofia",
    "Tomas",
    "Uma",
    "Viktor",
    "Wanda",
    "José",
    "Zeynep",
    "Björn",
    "Chiara",
]
LAST = [
    "Andersen",
    "Becker",
    "Costa",
    "Dubois",
    "Eriksen",
    "Fischer",
    "Garcia",
    "Horvat",
    "Ivanova",
    "Jensen",
    "Kowalski",
    "Lopez",
    "Moreau",
    "Novak",
    "Okafor",
    "Petrov",
    "Quist",
    "Rossi",
    "Schmidt",
    "Tanaka",
    "Ulrich",
    "Varga",
    "Weber",
    "Xu",
    "Yilmaz",
    "Zimmermann",
    "Almeida",
    "Brandt",
    "Chen",
    "Dimitrov",
    "Nakamura",
    "Silva",
    "O'Neill",
    "Müller",
]
DOMAINS = [
    "example.com",
    "example.org",
    "example.net",
    "mail.example",
    "inbox.example",
    "post.example",
    "northwind.example",
    "globex.example",
    "initech.example",
    "umbrella.example",
    "hooli.example",
    "vandelay.example",
]
SPAM_DOMAINS = [
    "deals-4u.example",
    "winner-prize.example",
    "seo-rockets.example",
    "pharma-best.example",
    "crypto-yield.example",
    "secure-verify.example",
]

PRODUCTS = [
    "wireless headphones",
    "standing desk",
    "coffee grinder",
    "USB-C hub",
    "mechanical keyboard",
    "webcam",
    "office chair",
    "Pro plan",
    "annual subscription",
    "smart thermostat",
    "laptop sleeve",
    "water filter",
    "e-reader",
    "monitor arm",
    "travel backpack",
]
COUNTRIES = ["Canada", "Norway", "Portugal", "Japan", "Brazil", "Ireland", "Poland", "Kenya"]
PLATFORMS = ["Windows 11", "macOS Sonoma", "Android 14", "iOS 17", "Ubuntu 22.04", "ChromeOS"]
MONTHS = ["January", "February", "March"]
ORDINALS = ["second", "third", "fourth", "fifth"]

GREETINGS = [
    "Hi,",
    "Hello,",
    "Hello team,",
    "Dear Acme Support,",
    "Dear Sir or Madam,",
    "Hey there,",
    "Hi support,",
    "Good morning,",
    "To whom it may concern,",
    "",
    "",
]
OPENERS = [
    "Hope you're doing well.",
    "I've been a customer for a few years now.",
    "Sorry to bother you.",
    "I'll keep this short.",
    "First time writing to you.",
    "A colleague suggested I write here.",
    "",
    "",
    "",
    "",
]
SIGNOFFS = [
    "Thanks,",
    "Thank you,",
    "Best regards,",
    "Regards,",
    "Cheers,",
    "Kind regards,",
    "Best,",
    "",
]
TRAILERS = ["", "", "", "", "Sent from my iPhone", "Sent from my phone, excuse typos"]


# --- phrasing per intent -----------------------------------------------------------------------

# Each intent: (body template, subjects that fit it) pairs, plus generic subjects for the
# intent; the subject is drawn from both, so it matches the body without repeating it.
QUESTION_SUBJECTS = [
    "Quick question",
    "Question",
    "Pre-sales question",
    "Info request",
    "Can you help?",
    "Hello",
]
QUESTIONS = [
    (
        "How do I change the shipping address on order {order}? It hasn't shipped yet.",
        ["Change of address", "{order}", "Address change for {order}"],
    ),
    (
        "Do you ship to {country}, and if so roughly how long does it take?",
        ["Shipping to {country}?", "International delivery"],
    ),
    (
        "What's the difference between the Basic and Pro plans? The pricing page is not "
        "clear to me.",
        ["Basic vs Pro", "Plans"],
    ),
    (
        "Can I add a second user to my account without upgrading?",
        ["Extra user", "Account question"],
    ),
    (
        "Is the {product} compatible with {platform}?",
        ["Question about the {product}", "Compatibility"],
    ),
    (
        "Where can I download the invoice for order {order}? I need it for my accountant.",
        ["Invoice for {order}", "Billing question"],
    ),
    (
        "What is your return policy for items that have been opened?",
        ["Returns policy", "Question about returns"],
    ),
    (
        "Once a refund is approved, how many days until it shows up on the card statement?",
        ["Refund timing", "Billing question"],
    ),
    ("Do you offer discounts for students or non-profits?", ["Discounts?", "Pricing"]),
    ("Can I pay by bank transfer instead of card?", ["Payment methods", "Billing question"]),
    ("Is there an API to export my order history?", ["API access", "Exporting data"]),
    (
        "How do I reset my password? I don't see the link on the login page on my phone.",
        ["Password", "Login help"],
    ),
    ("When will the {product} be back in stock?", ["Back in stock?", "{product} availability"]),
    (
        "Can I switch from monthly to annual billing in the middle of a cycle?",
        ["Annual billing", "Billing question"],
    ),
    (
        "Does the {product} come with a warranty, and for how long?",
        ["Warranty", "{product} warranty"],
    ),
    (
        "Could you tell me which courier you use for deliveries to {country}?",
        ["Courier?", "Delivery to {country}"],
    ),
    ("Is it possible to gift a subscription to someone else?", ["Gift subscription", "Gifting"]),
    (
        "Can I pick up order {order} in person instead of having it delivered?",
        ["Collection", "Pick up {order}"],
    ),
    (
        "We're a team of 25. Is there a volume discount on the Pro plan, and can we get one "
        "invoice?",
        ["Team pricing", "Pre-sales question"],
    ),
]
QUESTION_EXTRAS = [
    "Thanks in advance!",
    "No rush.",
    "I couldn't find this in the FAQ.",
    "Just want to check before I order.",
    "Any pointers appreciated.",
    "",
]

COMPLAINT_SUBJECTS = [
    "Very disappointed",
    "Complaint",
    "Terrible experience",
    "Feedback about your service",
    "This is not acceptable",
    "Unhappy customer",
]
COMPLAINTS = [
    (
        "My order {order} arrived {days} days late and nobody told me why.",
        ["Late delivery", "Order {order} - not happy"],
    ),
    (
        "The courier left the parcel in the rain and the box was soaked through.",
        ["Your courier", "Delivery"],
    ),
    (
        "I waited on hold for 45 minutes yesterday and then the call dropped. This is "
        "unacceptable.",
        ["Phone support", "45 minutes on hold"],
    ),
    ("The agent I spoke to on the phone was dismissive and frankly rude.", ["Rude agent"]),
    (
        "I'm really disappointed with the quality of the {product}. It feels cheap for the price.",
        ["Quality of the {product}"],
    ),
    (
        "I've clicked unsubscribe three times and I still get your newsletter every single day.",
        ["Stop emailing me", "Unsubscribe does not work"],
    ),
    (
        "I don't want a refund, I want the {product} I paid for to actually be delivered.",
        ["Where is my order?", "Order {order} - not happy"],
    ),
    (
        "You keep sending me marketing texts even though I opted out months ago.",
        ["Marketing texts", "Stop texting me"],
    ),
    ("Half a box of plastic packaging for a tiny {product}. Do better.", ["Packaging"]),
    (
        "The price of the {product} went up by 30% overnight without any notice.",
        ["Price increase", "30% more?!"],
    ),
    (
        "For the second time the invoice shows the wrong company name. I'm tired of this.",
        ["Wrong invoice again"],
    ),
    (
        "Your delivery driver drove over my lawn and damaged the gate while dropping off {order}.",
        ["Your driver", "Damage to my property"],
    ),
    (
        "The {product} I received was clearly used: scratches everywhere and missing the manual.",
        ["Used item sold as new", "Order {order} - not happy"],
    ),
    ("Nobody answered the live chat for an hour even though it said 'online'.", ["Live chat"]),
    (
        "The replacement you sent for {order} has exactly the same problem as the first one.",
        ["Replacement for {order}"],
    ),
    (
        "I asked for a refund last month and was told to wait; I'm writing to complain about how "
        "that was handled, not to ask again.",
        ["How I was treated", "Complaint"],
    ),
]
COMPLAINT_EXTRAS = [
    "I expect better from a company your size.",
    "Please pass this on to someone who actually cares.",
    "I've been a loyal customer and this is how I'm treated.",
    "Very poor.",
    "I will think twice before ordering again.",
    "",
]

FOLLOWUP_LINES = [
    "This is my {nth} email about this and I still haven't had a reply.",
    "Still nothing. I wrote to you on {date} and it's been {ago}.",
    "If I don't hear back by Friday I will dispute the charge with my bank.",
    "I want to speak to a manager. Please escalate this.",
    "Your silence is unbelievable. I'll be posting reviews everywhere I can.",
    "Following up AGAIN on my message below. Is anyone reading these?",
    "I'm getting really angry now. Nobody has even acknowledged my email.",
    "Do I have to call my lawyer to get an answer from you people?",
    "Not a word from you since. This is not how you treat customers.",
    "Hello?? Is anybody there?",
]
FOLLOWUP_PREFIXES = ["Re: ", "RE: ", "Re: Re: ", "Still waiting: ", "FW: ", "URGENT Re: "]

REFUND_SUBJECTS = ["Refund request", "Please refund my order", "Refund", "Money back", "Request"]
REFUNDS = [
    (
        "I'd like a refund for order {order}. The total was {amount}.",
        ["Refund request for {order}", "{order}"],
    ),
    (
        "I returned the {product} last week (order {order}) and still haven't got my "
        "{amount} back. Please process the refund.",
        ["Return and refund", "Returned {order}"],
    ),
    (
        "I was charged {amount} for a subscription I cancelled in {month}. Please reverse the "
        "charge.",
        ["Cancelled subscription charged", "Wrong charge"],
    ),
    (
        "Could you please reimburse {amount}? The {product} arrived broken.",
        ["Reimbursement", "Broken {product}"],
    ),
    (
        "Please cancel order {order} and give me my money back ({amount}).",
        ["Cancel and refund", "Cancel {order}"],
    ),
    (
        "You charged me twice for {order}. I need the duplicate payment of {amount} returned.",
        ["Charged twice", "Double charge on {order}"],
    ),
    (
        "The {product} doesn't do what was advertised. I want my money back: {amount}, "
        "order {order}.",
        ["Money back for {order}", "Not as advertised"],
    ),
    (
        "Requesting a full refund of {amount} for {order}; the item never shipped.",
        ["Never shipped", "Refund request for {order}"],
    ),
    (
        "I ordered the wrong size. Can I send it back and get the {amount} refunded?",
        ["Wrong size", "Return"],
    ),
    (
        "My plan renewed automatically and took {amount} from my account. I didn't want to renew, "
        "please pay it back.",
        ["Subscription renewal", "Auto-renewal"],
    ),
    (
        "Please I want the money return, {amount}, order {order}. Product is not working.",
        ["money return", "{order}"],
    ),
    (
        "Order {order} was {total} but the {product} was missing from the box. Please refund the "
        "missing item, which was {amount}.",
        ["Missing item in {order}", "Incomplete order"],
    ),
    (
        "The {product} stopped working after two days. I'd rather have my {amount} back than a "
        "replacement.",
        ["Faulty {product}", "Broken after two days"],
    ),
    (
        "I was billed {amount} after my free trial even though I cancelled. Please credit it back.",
        ["Billed after trial", "Trial charge"],
    ),
]
REFUND_EXTRAS = [
    "The receipt is attached.",
    "Thanks for sorting this out.",
    "I've already sent the item back with tracking.",
    "Let me know if you need anything else from me.",
    "",
    "",
]

BUG_SUBJECTS = ["Bug report", "Something is not working", "Possible bug", "Issue", "Glitch"]
BUGS = [
    (
        "When I click 'Export to CSV' on the reports page the downloaded file is empty.",
        ["Export broken", "Empty CSV export"],
    ),
    (
        "The mobile app crashes as soon as I open the Settings tab (version {version}, "
        "{platform}).",
        ["App crashes", "Crash on Settings"],
    ),
    (
        "I get 'Error {code}: something went wrong' every time I try to save my profile.",
        ["Error when saving", "Error {code}"],
    ),
    (
        "The dark mode toggle doesn't stick: after a reload everything is white again.",
        ["Dark mode", "Display issue"],
    ),
    (
        "Dates in the monthly report are shown in UTC instead of my time zone.",
        ["Wrong time zone in reports"],
    ),
    (
        "Search returns nothing for names with accents, e.g. 'José' or 'Müller'.",
        ["Search and accents"],
    ),
    ("Uploading a picture larger than 5 MB fails without any message.", ["Upload fails"]),
    (
        "Two-factor codes from the authenticator app are rejected unless I wait a full minute.",
        ["Problem with 2FA", "2FA codes rejected"],
    ),
    (
        "The checkout button stays greyed out in Safari; it works in Firefox.",
        ["Safari checkout", "Checkout button disabled"],
    ),
    (
        "Pagination on the orders page skips from page 2 straight to page 4.",
        ["Glitch on the orders page"],
    ),
    ("The invoice PDF for {order} shows 0% VAT although I'm in the EU.", ["VAT on invoice"]),
    (
        "Notifications arrive twice on {platform} since the last update.",
        ["Duplicate notifications"],
    ),
    ("The 'forgot password' email link leads to a blank page.", ["Reset link blank page"]),
    (
        "Sorting the product list by price puts $9.99 after $89.00, looks like it sorts as text.",
        ["Sorting by price is wrong"],
    ),
]
BUG_STEPS = [
    "Steps: log in, open the page, click the button. Expected it to work, got nothing.",
    "It happens every time, on two different devices.",
    "It started after the update last Tuesday.",
    "I cleared the cache and tried another browser, same thing.",
    "Screenshot attached.",
    "Not urgent, but annoying.",
    "",
    "",
]

OUTAGE_SUBJECTS = ["URGENT", "Outage?", "Everything is down", "Is your service down?", "Down!!"]
OUTAGES = [
    (
        "URGENT: your site is down for all of us, every page returns a 503.",
        ["URGENT - site down", "503 everywhere"],
    ),
    (
        "Nobody in our office can log in since {time}. Is something going on on your side?",
        ["CRITICAL: cannot log in", "Nobody can log in"],
    ),
    (
        "Our integration has been failing for 40 minutes: every API call times out.",
        ["API not responding", "API timeouts"],
    ),
    (
        "Production is down. Checkout fails for all of our customers. Please call me back ASAP.",
        ["P1: checkout broken for everyone", "PRODUCTION DOWN"],
    ),
    (
        "Is there an outage? The dashboard doesn't load at all, from any network we try.",
        ["Dashboard not loading"],
    ),
    (
        "All webhooks stopped arriving at {time} UTC. We are losing orders every minute.",
        ["Webhooks stopped", "URGENT: no webhooks"],
    ),
    (
        "Service unavailable everywhere and your status page says all green. What is happening?",
        ["Status page wrong?", "Service unavailable"],
    ),
    (
        "CRITICAL: payments are failing across all of our stores since {time}.",
        ["Payments failing", "CRITICAL"],
    ),
    (
        "None of our 40 users can reach the app. This is a complete outage for us.",
        ["Complete outage"],
    ),
    (
        "The whole platform is unreachable from Europe right now. We need an update immediately.",
        ["Unreachable from Europe"],
    ),
]
OUTAGE_EXTRAS = [
    "This is costing us money by the minute.",
    "Please treat this as the highest priority.",
    "We have an SLA with you for exactly this.",
    "Any ETA?",
    "",
]

SPAM_SUBJECTS = ["RE: our call", "Hello dear", "Important notice", "Opportunity", "Act now"]
SPAMS = [
    (
        "Congratulations! You have been selected to receive a $1000 gift card. Click the link "
        "below to claim your prize before it expires.",
        ["Congratulations, you've been selected!"],
    ),
    (
        "We can get your website to the first page of Google in 30 days. Guaranteed results "
        "or your money back!",
        ["Boost your Google ranking", "SEO offer"],
    ),
    (
        "Dear friend, I am a barrister and my late client left USD 7,500,000 with no heir. "
        "I propose we share it 50/50. Reply with your full details.",
        ["Confidential business proposal"],
    ),
    (
        "Your mailbox has exceeded its storage limit. Verify your account within 24 hours or it "
        "will be suspended: http://secure-verify.example/login",
        ["Your mailbox is almost full"],
    ),
    (
        "You have a pending tax refund of {amount}. Submit the form at "
        "http://refund-now.example to claim it today.",
        ["Pending tax refund notification", "Refund available"],
    ),
    (
        "Please find the overdue invoice attached. Open the document to avoid late fees.",
        ["Invoice #{code} overdue"],
    ),
    (
        "Limited offer: designer sunglasses at 90% off, today only! Shop now.",
        ["90% off today only"],
    ),
    (
        "We build beautiful websites and apps at unbeatable prices. Can we schedule a quick call?",
        ["Partnership opportunity", "Web development"],
    ),
    (
        "Our AI crypto bot doubled its users' money in 7 days. Start with just $250.",
        ["Double your money in 7 days"],
    ),
    ("Cheap meds online, no prescription needed, discreet shipping worldwide.", ["Best prices"]),
    (
        "I came across your company and would love to write a guest post for your blog. We also "
        "sell backlinks at a great rate.",
        ["Guest post", "Collaboration"],
    ),
]
SPAM_FOOTERS = [
    "To unsubscribe click here.",
    "You received this email because you signed up on our partner site. Unsubscribe.",
    "This is not spam. Reply STOP to opt out.",
    "",
    "",
]

PII_LINES = {
    "email": [
        "Please also copy my work address {email} on your reply.",
        "You can write to my personal address instead: {email}",
        "My wife usually handles this, her email is {email}.",
    ],
    "phone": [
        "You can reach me on {phone} if that's easier.",
        "Call me at {phone}, any time after 5pm.",
        "My mobile number is {phone}.",
    ],
    "card": [
        "The charge was on my card {card}, expiry 08/27.",
        "For reference the card used was {card}.",
    ],
    "iban": [
        "Please send the money to my account, IBAN {iban}.",
        "My bank details: IBAN {iban}, account holder {name}.",
    ],
}
# Card and bank details only turn up where money is discussed.
PII_KINDS = {
    "refund": ["email", "phone", "card", "iban"],
    "complaint": ["email", "phone", "card"],
}
PII_DEFAULT_KINDS = ["email", "phone"]

PHRASES = {  # intent -> (generic subjects, (body, its subjects) pairs, closing sentences)
    "question": (QUESTION_SUBJECTS, QUESTIONS, QUESTION_EXTRAS),
    "complaint": (COMPLAINT_SUBJECTS, COMPLAINTS, COMPLAINT_EXTRAS),
    "refund": (REFUND_SUBJECTS, REFUNDS, REFUND_EXTRAS),
    "bug": (BUG_SUBJECTS, BUGS, BUG_STEPS),
    "outage": (OUTAGE_SUBJECTS, OUTAGES, OUTAGE_EXTRAS),
    "spam": (SPAM_SUBJECTS, SPAMS, SPAM_FOOTERS),
}

ATTACHMENTS = {
    "refund": [("invoice.pdf", "application/pdf"), ("receipt.jpg", "image/jpeg")],
    "bug": [
        ("screenshot.png", "image/png"),
        ("error.log", "text/plain"),
        ("screen-recording.mp4", "video/mp4"),
    ],
    "complaint": [("photo.jpg", "image/jpeg"), ("damaged_box.heic", "image/heic")],
    "followup": [("photo.jpg", "image/jpeg")],
    "outage": [("network.har", "application/json"), ("status.png", "image/png")],
    "spam": [
        ("invoice.zip", "application/zip"),
        ("document.pdf.exe", "application/x-msdownload"),
        ("offer.html", "text/html"),
    ],
    "question": [("photo.jpg", "image/jpeg")],
}
ATTACH_RATE = {
    "refund": 0.4,
    "bug": 0.5,
    "complaint": 0.2,
    "followup": 0.1,
    "outage": 0.1,
    "spam": 0.2,
    "question": 0.05,
}


# --- the generator -----------------------------------------------------------------------------


@dataclass
class Customer:
    name: str
    address: str
    orders: list[str] = field(default_factory=list)


@dataclass
class Sent:
    """An email a follow-up can answer."""

    id: str
    customer: Customer
    subject: str
    body: str
    at: datetime
    pii_text: str | None
    replies: int = 0


class Generator:
    def __init__(self, seed: int, count: int) -> None:
        self.rng = random.Random(seed)
        self.count = count
        self.width = max(4, len(str(count)))
        self.customers = [self._customer() for _ in range(max(20, count // 3))]
        self.threads: list[Sent] = []

    # -- small draws

    def pick(self, options: list[str]) -> str:
        return self.rng.choice(options)

    def _customer(self) -> Customer:
        first, last = self.pick(FIRST), self.pick(LAST)
        local = self.pick(
            [
                f"{first}.{last}",
                f"{first[0]}{last}",
                f"{first}_{last}",
                f"{first}{self.rng.randint(1, 99)}",
                f"{last}.{first[0]}",
            ]
        )
        local = local.lower().replace("'", "").translate(str.maketrans("éöüø", "eouo"))
        return Customer(f"{first} {last}", f"{local}@{self.pick(DOMAINS)}")

    def order(self, customer: Customer) -> str:
        if customer.orders and self.rng.random() < 0.5:
            return self.pick(customer.orders)
        order = f"ORD-{self.rng.randint(100000, 999999)}"
        customer.orders.append(order)
        return order

    def amount(self, over: bool) -> float:
        roll = self.rng.random()
        if over:
            value = self.rng.uniform(200.01, 1500) if roll < 0.85 else self.rng.uniform(200.5, 260)
        elif roll < 0.06:
            return 200.0  # the boundary: at the limit is still within it
        else:
            value = self.rng.uniform(5, 199.99)
        return round(value, 2) if self.rng.random() < 0.8 else float(round(value))

    def money(self, value: float) -> str:
        """``value`` written the many ways people write money."""
        whole = value == int(value)
        usd = self.rng.random() < 0.65
        num = f"{value:,.0f}" if whole and self.rng.random() < 0.5 else f"{value:,.2f}"
        if usd:
            forms = [f"${num}", f"${num}", f"USD {num}", f"{num} USD", f"{num} dollars"]
        else:
            comma = num.replace(",", " ").replace(".", ",")
            forms = [f"{num} EUR", f"€{num}", f"EUR {num}", f"{comma} €", f"{num} euros"]
        return self.pick(forms)

    def when(self, slot: int) -> datetime:
        # Spread evenly over SPAN_DAYS, jittered within each slot's share: ids stay in time order.
        base = START + timedelta(days=SPAN_DAYS * slot / self.count)
        return base + timedelta(seconds=self.rng.randint(0, int(SPAN_DAYS * 86400 / self.count)))

    def phone(self) -> str:
        return self.pick(
            [
                f"+44 7700 {self.rng.randint(900000, 900999)}",
                f"(555) 01{self.rng.randint(0, 9)}-{self.rng.randint(1000, 9999)}",
                f"+49 151 {self.rng.randint(1000000, 9999999)}",
                f"+1 415-555-{self.rng.randint(1000, 9999)}",
            ]
        )

    def card(self) -> str:
        digits = [4] + [self.rng.randint(0, 9) for _ in range(14)]
        total = 0  # Luhn check digit, so the number looks like a real card to a validator
        for i, d in enumerate(reversed(digits)):
            if i % 2 == 0:
                d *= 2
                d -= 9 if d > 9 else 0
            total += d
        digits.append((10 - total % 10) % 10)
        text = "".join(map(str, digits))
        return " ".join(text[i : i + 4] for i in range(0, 16, 4))

    def iban(self) -> str:
        bban = "".join(str(self.rng.randint(0, 9)) for _ in range(18))
        check = 98 - int(bban + "131400") % 97  # "DE00" moved to the end, letters as numbers
        text = f"DE{check:02d}{bban}"
        return " ".join(text[i : i + 4] for i in range(0, len(text), 4))

    def pii_line(self, kind: str, customer: Customer) -> str:
        category = self.pick(PII_KINDS.get(kind, PII_DEFAULT_KINDS))
        return self.pick(PII_LINES[category]).format(
            email=self._customer().address,
            phone=self.phone(),
            card=self.card(),
            iban=self.iban(),
            name=customer.name,
        )

    def attachments(self, kind: str) -> list[dict[str, Any]]:
        if self.rng.random() >= ATTACH_RATE[kind]:
            return []
        name, content_type = self.rng.choice(ATTACHMENTS[kind])
        size = self.rng.randint(2_000, 4_000_000)
        return [{"name": name, "size": size, "content_type": content_type}]

    def compose(
        self,
        customer: Customer,
        core: list[str],
        pii: str | None,
        quoted: str | None,
        *,
        spam: bool,
    ) -> str:
        """Greeting, filler, the substance (PII woven in), sign-off, then any quoted mail."""
        parts: list[str] = []
        if not spam:
            parts.append(self.pick(GREETINGS))
            parts.append(self.pick(OPENERS))
        sentences = [s for s in core if s]
        if pii:
            sentences.insert(self.rng.randint(1, len(sentences)), pii)
        parts.append(" ".join(sentences) if self.rng.random() < 0.6 else "\n\n".join(sentences))
        if not spam:
            signoff = self.pick(SIGNOFFS)
            first = customer.name.split()[0]
            parts.append(f"{signoff}\n{first}" if signoff else f"- {first}")
            parts.append(self.pick(TRAILERS))
        if quoted:
            parts.append(quoted)
        return "\n\n".join(p for p in parts if p)

    def values(self, customer: Customer) -> dict[str, Any]:
        """One draw of every placeholder, shared by an email's subject and body."""
        minute = self.pick(["00", "15", "30", "45"])
        return {
            "order": self.order(customer),
            "product": self.pick(PRODUCTS),
            "country": self.pick(COUNTRIES),
            "platform": self.pick(PLATFORMS),
            "month": self.pick(MONTHS),
            "days": self.rng.randint(3, 21),
            "time": f"{self.rng.randint(6, 17):02d}:{minute}",
            "version": ".".join(str(self.rng.randint(0, n)) for n in (5, 19, 9)),
            "code": self.rng.randint(1000, 9999),
        }

    # -- one email per intent

    def email(self, slot: int, kind: str) -> dict[str, Any]:
        at = self.when(slot)
        open_threads = [t for t in self.threads if t.at < at - timedelta(days=1)]
        if kind == "followup" and not open_threads:
            kind = "complaint"
        customer = self.pick_customer(kind)
        values = self.values(customer)
        amount: float | None = None
        thread: str | None = None
        pii = self.rng.random() < PII_RATE[kind]
        pii_text = self.pii_line(kind, customer) if pii else None
        quoted: str | None = None

        if kind == "followup":
            # Recent threads are the likeliest to get chased; chains of follow-ups happen.
            original = self.rng.choice(open_threads[-12:])
            customer = original.customer
            thread = original.id
            original.replies += 1
            values["nth"] = ORDINALS[min(original.replies - 1, len(ORDINALS) - 1)]
            values["date"] = f"{original.at:%B} {original.at.day}"
            days = (at - original.at).days
            values["ago"] = f"{days} day" if days == 1 else f"{days} days"
            prefix = self.pick(FOLLOWUP_PREFIXES)
            subject = prefix + original.subject.removeprefix("Re: ")
            lines = self.rng.sample(FOLLOWUP_LINES, k=self.rng.randint(1, 3))
            core = [line.format(**values) for line in lines]
            paragraphs = original.body.split("\n\n")
            quote = next((q for q in paragraphs if len(q) > 40), paragraphs[0])
            if self.rng.random() < 0.7:
                quoted = (
                    f"On {original.at:%a, %d %b %Y}, {customer.name} wrote:\n> "
                    + quote.replace("\n", "\n> ")
                )
                # Quoting the original can quote its personal data too.
                if original.pii_text and original.pii_text in quote:
                    pii = True
            kind = "complaint"
        else:
            generic, pairs, extras = PHRASES[kind]
            template, subjects = self.rng.choice(pairs)
            if kind == "refund":
                amount = self.amount(over=self.rng.random() < 0.42)
                values["amount"] = self.money(amount)
                values["total"] = self.money(round(amount * self.rng.uniform(1.5, 3), 2))
            elif kind == "spam":
                values["amount"] = self.money(round(self.rng.uniform(80, 900), 2))
            subject = self.pick(subjects if self.rng.random() < 0.7 else generic)
            subject = subject.format(**values)
            core = [template.format(**values), self.pick(extras)]

        if self.rng.random() < 0.08:
            subject = subject.upper()
        elif self.rng.random() < 0.08:
            subject = subject.lower()
        body = self.compose(customer, core, pii_text, quoted, spam=kind == "spam")
        ident = self.ident(slot)
        if kind in ("question", "complaint", "refund", "bug"):
            self.threads.append(Sent(ident, customer, subject, body, at, pii_text))
        action = {
            "question": "reply",
            "complaint": "ticket",
            "bug": "ticket",
            "spam": "ignore",
            "outage": "escalate",
            "refund": "reply" if amount is not None and amount <= REFUND_LIMIT else "escalate",
        }[kind]
        return {
            "id": ident,
            "from": customer.address,
            "to": SUPPORT,
            "subject": subject,
            "body": body,
            "received_at": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "thread": thread,
            "attachments": self.attachments(kind if thread is None else "followup"),
            "expected": {"intent": kind, "action": action, "amount": amount, "pii": pii},
        }

    def pick_customer(self, kind: str) -> Customer:
        if kind == "spam":
            word = self.pick(["promo", "offers", "noreply", "winner", "info", "ceo", "support"])
            return Customer("", f"{word}@{self.pick(SPAM_DOMAINS)}")
        return self.rng.choice(self.customers)

    def ident(self, slot: int) -> str:
        return f"e{slot + 1:0{self.width}d}"

    # -- malformed rows: what a real inbox export also contains

    def malformed(self, slot: int, kind: str) -> str:
        good = self.email(slot, "question")
        self.threads = [t for t in self.threads if t.id != good["id"]]
        good["thread"] = None
        good["expected"] = {"intent": None, "action": "reject", "amount": None, "pii": False}
        if kind == "missing_from":
            del good["from"]
        elif kind == "body_not_string":
            good["body"] = {"html": "<p>" + good["subject"] + "</p>"}
        elif kind == "empty":
            good["subject"] = ""
            good["body"] = ""
        elif kind == "garbage":
            noise = "".join(
                self.rng.choice("\x00\x01\x07\x1b\ufffd\u00ff\u00fe\u00e3\u0192\u2020PK\x03\x04")
                for _ in range(120)
            )
            good["subject"] = "=?utf-8?B?" + "".join(self.rng.choices("QWERTYuiop0189+/", k=24))
            good["body"] = noise
        elif kind == "bad_from":
            good["from"] = "not an email address"
        elif kind == "body_null":
            good["body"] = None
        elif kind == "bad_date":
            good["received_at"] = "sometime last tuesday"
        elif kind == "not_an_object":
            return json.dumps([good["id"], good.get("from"), good["subject"]], ensure_ascii=False)
        elif kind == "truncated_json":
            text = json.dumps(good, ensure_ascii=False)
            return text[: len(text) // 3]
        return json.dumps(good, ensure_ascii=False)

    # -- the whole file

    def lines(self) -> list[str]:
        n_bad = min(len(MALFORMED), max(1, self.count // 65))
        # Never in the first tenth, so a run that stops early still sees clean data first.
        bad_slots = sorted(self.rng.sample(range(self.count // 10, self.count), n_bad))
        bad_kinds = dict(zip(bad_slots, MALFORMED[:n_bad], strict=True))
        kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
        out = []
        for slot in range(self.count):
            if slot in bad_kinds:
                out.append(self.malformed(slot, bad_kinds[slot]))
                continue
            kind = self.rng.choices(kinds, weights)[0]
            out.append(json.dumps(self.email(slot, kind), ensure_ascii=False))
        return out


def generate(seed: int = 7, count: int = 600) -> str:
    """The dataset as JSON-lines text."""
    if count < 1:
        raise ValueError("count must be >= 1")
    return "".join(line + "\n" for line in Generator(seed, count).lines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("-o", "--output", default="-", help="file to write; '-' for stdout")
    args = parser.parse_args(argv)
    text = generate(args.seed, args.count)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8", newline="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
