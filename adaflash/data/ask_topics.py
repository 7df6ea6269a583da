"""Topics and worked examples for `data ask`: what the target is asked to write prompts about.

Written for adaflash. The topics span what people bring to an assistant (daily life, work, study,
code, science, culture); the examples show the two forms a prompt takes, a question and a request,
so the target's own prompts come in both.
"""

from __future__ import annotations

TOPICS: tuple[str, ...] = (
    # daily life
    "cooking rice", "baking bread", "meal planning for a week", "a vegetarian dinner", "storing leftovers",
    "cleaning a kitchen", "doing laundry", "removing stains", "organizing a closet", "moving to a new city",
    "renting an apartment", "buying a used car", "fixing a flat bicycle tire", "saving money each month",
    "paying off a credit card", "a household budget", "planning a birthday party", "a wedding toast",
    "choosing a gift for a friend", "caring for a houseplant", "growing tomatoes", "composting at home",
    "training a puppy", "caring for an old cat", "keeping a fish tank", "sleeping better", "a morning routine",
    "drinking enough water", "starting to run", "stretching after exercise", "a home workout without equipment",
    "learning to swim", "hiking safely", "camping for the first time", "packing for a trip", "jet lag",
    "travelling on a small budget", "visiting Japan", "a weekend in Paris", "renewing a passport",
    "talking to a noisy neighbour", "making new friends as an adult", "a difficult conversation with a parent",
    "helping a child with homework", "screen time for children", "a family game night", "a first date",
    # work and study
    "writing a resume", "a cover letter", "a job interview", "asking for a raise", "giving feedback to a colleague",
    "running a meeting", "writing a project plan", "time management", "working from home", "burnout",
    "starting a small business", "pricing a product", "a marketing email", "a customer complaint",
    "writing a business proposal", "reading a balance sheet", "negotiating a contract", "public speaking",
    "preparing for an exam", "taking notes in class", "writing an essay", "citing sources", "a science fair project",
    "learning a new language", "Spanish verb tenses", "English grammar", "memorizing vocabulary",
    "reading faster", "applying to university", "a scholarship application", "a research paper abstract",
    # programming and computers
    "Python lists", "Python dictionaries", "reading a CSV file in Python", "writing unit tests",
    "regular expressions", "recursion", "sorting algorithms", "binary search", "hash tables", "linked lists",
    "big O notation", "SQL joins", "database indexes", "a REST API", "JSON", "HTTP status codes",
    "git branches", "merge conflicts", "debugging a crash", "exceptions in Python", "async code",
    "JavaScript promises", "CSS layout", "a responsive web page", "React components", "TypeScript types",
    "a command-line tool", "shell scripts", "Docker containers", "Linux file permissions", "SSH keys",
    "password security", "phishing emails", "backing up files", "a slow laptop", "choosing a programming language",
    "object-oriented design", "functional programming", "a text adventure game", "a to-do list app",
    "a web scraper", "data visualization", "pandas dataframes", "machine learning basics", "neural networks",
    "overfitting", "a spreadsheet formula", "Excel pivot tables", "memory leaks", "concurrency bugs",
    # science and nature
    "photosynthesis", "the water cycle", "volcanoes", "earthquakes", "black holes", "the solar system",
    "the phases of the moon", "gravity", "electricity", "magnets", "sound waves", "light and color",
    "atoms and molecules", "chemical reactions", "acids and bases", "DNA", "evolution", "the immune system",
    "vaccines", "the human heart", "the brain", "sleep and memory", "nutrition", "vitamins", "bees",
    "whales", "rainforests", "deserts", "climate change", "renewable energy", "recycling plastic",
    "weather forecasts", "hurricanes", "the ocean tides", "dinosaurs", "fossils", "the speed of light",
    "probability", "fractions", "percentages", "prime numbers", "geometry of circles", "algebra equations",
    "statistics and averages", "compound interest", "unit conversions", "logic puzzles",
    # culture, history and society
    "the Roman Empire", "ancient Egypt", "the French Revolution", "the Industrial Revolution",
    "World War I", "the Cold War", "the printing press", "the history of the internet", "the Renaissance",
    "democracy", "how laws are made", "the stock market", "inflation", "supply and demand",
    "philosophy of ethics", "Greek mythology", "Shakespeare", "writing a short story", "writing a poem",
    "a book club discussion", "classical music", "learning the guitar", "painting with watercolors",
    "photography", "film editing", "chess openings", "soccer rules", "the Olympic Games", "video game design",
    "social media", "online privacy", "volunteering", "a speech for a graduation", "holiday traditions",
    "a museum visit", "architecture", "fashion", "podcasts", "news literacy", "translating a menu",
)

# Worked examples shown before each topic: (topic, a question, a request).
EXAMPLES: tuple[tuple[str, str, str], ...] = (
    ("cooking pasta", "How long should I boil spaghetti so it stays firm?",
     "Give me a simple tomato sauce recipe for four people."),
    ("job interviews", "What should I say when asked about my biggest weakness?",
     "Write a short thank-you email to send after an interview."),
    ("Python strings", "Why does my string comparison fail when the text has trailing spaces?",
     "Write a Python function that counts the vowels in a sentence."),
    ("the moon", "Why do we always see the same side of the moon?",
     "Explain the phases of the moon to a ten-year-old."),
    ("budgeting", "Is it better to pay off debt or to save first?",
     "Make a monthly budget for someone who earns 3,000 dollars."),
    ("learning French", "What is the difference between tu and vous?",
     "Translate 'Where is the train station?' into French and explain each word."),
    ("ancient Rome", "Why did the Roman Republic become an empire?",
     "Summarize the life of Julius Caesar in five sentences."),
    ("SQL", "What does a LEFT JOIN return when there is no match?",
     "Write a query that finds the three customers with the most orders."),
    ("gardening", "When should I plant garlic?",
     "List the steps to start a small vegetable garden on a balcony."),
    ("writing", "How can I make the opening line of a story more gripping?",
     "Rewrite this sentence to sound more formal: 'We gotta finish this by Friday.'"),
)
